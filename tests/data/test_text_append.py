"""A text corpus grown by new files or by lines appended to its last JSONL file is ingested by its
new documents alone (assets/kinds/text_append.py): the raw copy, the report and the record are a
whole read's of the grown corpus, byte for byte, and anything that is not such a growth is read
whole, the log naming the file and why."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from assets.kinds.text import TEXT
from assets.kinds.text_append import PublishedCorpus
from core.spec import TextCorpus, dataset_pipeline

KEY = {"parameters": "p", "code": "c"}
NEW = "only the new documents read"


def _spec(docs_per_chunk: int = 7, labels=None, min_chars: int = 1):
    return dataset_pipeline(
        "toy", source=TextCorpus(paths=("c/*",), docs_per_chunk=docs_per_chunk, min_chars=min_chars,
                                 label_field="label" if labels else None),
        task="classification" if labels else "language_modeling", classes=labels or (),
        split={"samples_per_shard": 8})


def _text(i: int) -> str:
    rng = random.Random(i)
    return " ".join(rng.choice(["data", "token", "naïve", "日本", "part", "é"]) for _ in range(rng.randint(2, 30)))


def _lines(start: int, stop: int, labels=None) -> str:
    return "".join(json.dumps({"text": _text(i), **({"label": labels[i % len(labels)]} if labels else {})}) + "\n"
                   for i in range(start, stop))


class Corpus:
    """A corpus folder, its published version (ingested whole) and ingests of it grown."""

    def __init__(self, folder: Path, spec):
        self.folder, self.spec = folder, spec
        self.root = folder / "src"
        (self.root / "c").mkdir(parents=True)
        self.n = 0

    def write(self, name: str, text: str, append: bool = False) -> None:
        with open(self.root / "c" / name, "a" if append else "w", encoding="utf-8") as f:
            f.write(text)

    def files(self) -> list[Path]:
        return sorted((self.root / "c").iterdir())

    def ingest(self, published=None, spec=None, key=KEY):
        self.n += 1
        out = self.folder / f"v{self.n}" / "documents.parquet"
        out.parent.mkdir()
        return TEXT.ingest(spec or self.spec, self.files(), self.root, out, key=key, published=published)

    def publish(self):
        raw = self.ingest()
        assert raw.report.passed and raw.record and "not_appendable" not in raw.record, raw.report.failures
        kept = self.folder / f"published{self.n}.parquet"
        shutil.copy(raw.path, kept)
        return raw, PublishedCorpus(raw.record, lambda dest: Path(shutil.copy(kept, dest)))

    def both(self, published, spec=None, key=KEY):
        """(the ingest built on ``published``, a whole read of the same corpus)."""
        return self.ingest(published, spec, key), self.ingest(None, spec, key)


def _same(grown, whole) -> None:
    assert grown.path.read_bytes() == whole.path.read_bytes()
    assert grown.report.to_json() == whole.report.to_json()
    assert grown.record == whole.record and grown.sources == whole.sources and grown.rows == whole.rows


@pytest.mark.parametrize("chunk", [7, 5, 1000])  # the published last chunk partial, whole (35 = 7 * 5), the only one
def test_new_txt_files_alone_give_the_whole_read(tmp_path, chunk):
    corpus = Corpus(tmp_path, _spec(chunk))
    for i in range(35):
        corpus.write(f"d{i:03d}.txt", _text(i))
    _, published = corpus.publish()
    for i in range(35, 47):
        corpus.write(f"d{i:03d}.txt", _text(i))
    grown, whole = corpus.both(published)
    assert grown.how.startswith(NEW) and "12 new document(s)" in grown.how and "d035.txt" in grown.how
    assert whole.how.startswith("every document read")
    _same(grown, whole)
    assert pq.ParquetFile(grown.path).metadata.num_rows == 47


def test_appended_lines_and_new_jsonl_files_alone_give_the_whole_read_over_versions(tmp_path):
    labels = ["neg", "pos"]
    corpus = Corpus(tmp_path, _spec(6, labels))
    corpus.write("a.jsonl", _lines(0, 20, labels))
    _, published = corpus.publish()
    corpus.write("a.jsonl", _lines(20, 23, labels), append=True)  # appended lines only
    grown, whole = corpus.both(published)
    assert "3 new document(s) of c/a.jsonl (bytes" in grown.how
    _same(grown, whole)
    assert json.loads(whole.report.to_json())["passed"]
    # v3 builds on v2's record (the one the appended ingest made): new lines and a new file at once
    v2 = PublishedCorpus(grown.record, lambda dest: Path(shutil.copy(grown.path, dest)))
    corpus.write("a.jsonl", "\n" + _lines(23, 30, labels), append=True)  # a blank line is numbered, not a document
    corpus.write("b.jsonl", _lines(30, 41, labels))
    grown, whole = corpus.both(v2)
    assert grown.how.startswith(NEW) and "18 new document(s)" in grown.how and "c/b.jsonl" in grown.how
    _same(grown, whole)
    ids = pq.read_table(grown.path, columns=["id"]).column(0).to_pylist()
    assert ids[20:24] == ["c/a.jsonl:21", "c/a.jsonl:22", "c/a.jsonl:23", "c/a.jsonl:25"] and len(ids) == 41


def test_a_new_documents_failure_is_reported_as_a_whole_read_reports_it(tmp_path):
    """Problems in the new documents (a short one, a bad line) name their file and line, and the
    verdicts of every expectation are the whole read's, although only the new documents were read."""
    corpus = Corpus(tmp_path, _spec(4, min_chars=3))
    corpus.write("a.jsonl", _lines(0, 10))
    _, published = corpus.publish()
    corpus.write("a.jsonl", json.dumps({"text": "ab"}) + "\nnot json\n" + _lines(12, 14), append=True)
    grown, whole = corpus.both(published)
    assert grown.how.startswith(NEW) and not grown.report.passed and grown.record is None
    assert any("c/a.jsonl line 11: 2 characters" in f for f in grown.report.failures)
    assert any("c/a.jsonl line 12: not JSON" in f for f in grown.report.failures)
    assert grown.report.to_json() == whole.report.to_json()


def _fallback(tmp_path, change, expected: str, spec=None, key=KEY):
    corpus = Corpus(tmp_path, _spec(5))
    corpus.write("b.jsonl", _lines(0, 8))
    corpus.write("c.txt", _text(8))
    corpus.write("d.jsonl", _lines(9, 20))
    _, published = corpus.publish()
    change(corpus)
    grown, whole = corpus.both(published, spec, key)
    assert grown.how.startswith("every document read") and expected in grown.how, grown.how
    _same(grown, whole)


def test_a_changed_published_file_is_read_whole(tmp_path):
    _fallback(tmp_path, lambda c: c.write("c.txt", "other words"), "c/c.txt changed since the published version")


def test_a_removed_published_file_is_read_whole(tmp_path):
    _fallback(tmp_path, lambda c: (c.root / "c" / "c.txt").unlink(), "c/c.txt was published but is not in the corpus")


def test_a_renamed_published_file_is_read_whole(tmp_path):
    """A rename to a name sorting later reorders the published files: read whole, naming it."""
    _fallback(tmp_path, lambda c: (c.root / "c" / "b.jsonl").rename(c.root / "c" / "e.jsonl"),
              "c/b.jsonl was published but is not in the corpus now")


def test_a_new_file_sorting_before_a_published_one_is_read_whole(tmp_path):
    _fallback(tmp_path, lambda c: c.write("a.txt", "first words"),
              "the new file c/a.txt sorts before the published c/b.jsonl")


def test_an_edited_last_file_is_read_whole(tmp_path):
    def edit(c):
        data = (c.root / "c" / "d.jsonl").read_text()
        c.write("d.jsonl", data.replace("data", "DATA", 1) + _lines(20, 22))

    _fallback(tmp_path, edit, "c/d.jsonl's first")


def test_a_last_file_that_did_not_end_with_a_line_end_is_read_whole(tmp_path):
    corpus = Corpus(tmp_path, _spec(5))
    corpus.write("d.jsonl", _lines(0, 11).rstrip("\n"))
    _, published = corpus.publish()
    assert published.record["files"][0]["ends_line"] is False
    corpus.write("d.jsonl", "\n" + _lines(11, 13), append=True)
    grown, whole = corpus.both(published)
    assert "c/d.jsonl did not end with a line end when published" in grown.how
    _same(grown, whole)


def test_a_changed_reader_parameter_is_read_whole(tmp_path):
    """The data key's parameters hold the reader's (docs_per_chunk, text field, lengths): another
    value is another ingest, read whole."""
    def grow(c):
        c.write("e.txt", "new words here")

    _fallback(tmp_path, grow, "the pipeline's parameters (the reader's among them)", spec=_spec(6),
              key={"parameters": "p2", "code": "c"})


def test_a_record_that_does_not_match_its_raw_copy_is_read_whole(tmp_path):
    corpus = Corpus(tmp_path, _spec(5))
    corpus.write("d.jsonl", _lines(0, 12))
    raw, published = corpus.publish()
    wrong = PublishedCorpus({**published.record, "documents": 13}, published.fetch)
    corpus.write("e.txt", "new words here")
    grown, whole = corpus.both(wrong)
    assert "the published raw copy (3 row groups, 12 documents) is not the one its record describes" in grown.how
    _same(grown, whole)


def test_a_symbolic_link_makes_a_version_no_later_one_builds_on(tmp_path):
    corpus = Corpus(tmp_path, _spec(5))
    corpus.write("d.jsonl", _lines(0, 12))
    (corpus.root / "target.txt").write_text("linked words")
    (corpus.root / "c" / "e.txt").symlink_to(corpus.root / "target.txt")
    raw = corpus.ingest()
    assert raw.report.passed and raw.record["not_appendable"] == "c/e.txt is a symbolic link, whose target may " \
                                                                 "change unseen"
    corpus.write("f.txt", "new words here")
    grown = corpus.ingest(PublishedCorpus(raw.record, lambda dest: Path(shutil.copy(raw.path, dest))))
    assert grown.how.startswith("every document read") and "cannot be built on: c/e.txt is a symbolic link" in grown.how
