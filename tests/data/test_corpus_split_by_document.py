"""A text corpus is split by document, as docs/images-and-text.md says before a user finds out:
two long .txt files are two documents, so a split is left empty, and the run is refused with the
sentence the page quotes; nothing of it reaches main, which ``python -m pipelines log`` shows."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import pytest

from core.spec import TextCorpus, TextPreprocessing
from pipelines.api import dataset_pipeline
from pipelines.cli import main
from tests.pipeline.conftest import Platform, failure_messages

pytestmark = pytest.mark.slow

PAGE = Path(__file__).resolve().parents[2] / "docs" / "images-and-text.md"


def documented_refusal() -> str:
    """The refusal the page quotes, word for word."""
    text = " ".join(PAGE.read_text().split())
    match = re.search(r"Two long `\.txt` files are refused before any shard is written: `([^`]+)`", text)
    assert match, f"{PAGE} no longer quotes the refusal of a corpus of two long files"
    return match[1]


def test_two_long_files_leave_a_split_empty_and_are_refused_as_the_docs_say(tmp_path, monkeypatch, capsys):
    books = tmp_path / "books"
    books.mkdir()
    chapter = "It was a long story, told in one file, as a user might bring a book. " * 400
    for name in ("part-1.txt", "part-2.txt"):  # by their names' hash, both documents fall in train
        (books / name).write_text(chapter)
    spec = dataset_pipeline("books", source=TextCorpus(paths=(f"{books}/*.txt",)), task="language_modeling",
                            preprocessing=TextPreprocessing(seq_len=32))
    platform = Platform(tmp_path / "platform")
    platform.instance.dispose()
    platform.instance = dg.DagsterInstance.ephemeral()
    with platform.instance:
        store = platform.store()
        store.ensure_repository()
        main_before = store.resolve_ref("main")
        result = platform.run(spec)
    assert not result.success
    assert documented_refusal() in failure_messages(result)
    assert store.resolve_ref("main") == main_before
    branch = f"run-{result.run_id}"
    assert not [o.path for o in store.list_objects(branch, prefix="datasets/books/shards/")]

    monkeypatch.setenv("DAGSTER_HOME", str(platform.root))
    monkeypatch.delenv("PLATFORM_PROFILE", raising=False)
    assert main(["log"]) == 0
    on_main = capsys.readouterr().out
    assert "Ingest raw data of books" not in on_main and "Repository created" in on_main
    assert main(["log", "--branch", branch]) == 0
    assert "Ingest raw data of books" in capsys.readouterr().out
