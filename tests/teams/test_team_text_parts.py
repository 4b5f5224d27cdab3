"""A team's text corpus in parts, for a code location outside the repository, as a user runs it on
an empty DAGSTER_HOME: the quill team's package (written to a temporary folder, which nothing in
the repository can import) declares a language model on a JSONL corpus in the store's sources
area, its parts tokenized two to a Dagster step. ``python -m pipelines sources add`` commits the
corpus and ``python -m pipelines train`` makes version 1; then documents are appended to the
corpus, committed the same way, and trained again. The second dataset version's commit adds and
removes the shard files of the parts the new documents fall in, and the manifest, nothing else;
its new parts were tokenized in steps of their own, and version 2 trained on that commit."""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from core.datasets import dataset_tags
from core.registry import list_versions, read_lineage
from training_runtime.data.split import open_split
from tests.teams.team_cli import team_location

pytestmark = pytest.mark.slow

NAME = "quill_notes"
DEFINITIONS = textwrap.dedent(f'''
    from pipelines.api import TextCorpus, TextPreprocessing, model_pipeline, team_definitions

    notes = model_pipeline(
        "{NAME}", source=TextCorpus(paths=("quill/notes.jsonl",), parts_per_step=2), task="language_modeling",
        preprocessing=TextPreprocessing(tokenizer="byte", seq_len=32, part_documents=16),
        model="transformer_lm", model_kwargs={{"d_model": 32, "nhead": 2, "num_layers": 1, "dim_feedforward": 64}},
        recipe={{"epochs": 1, "batch_size": 32, "lr": 0.005, "world_size": 1, "checkpoint_every_steps": 1000}},
        gate={{"test_perplexity": {{"max": 1000}}}}, split={{"seed": 0, "samples_per_shard": 16}}, team="quill")

    defs = team_definitions("quill", [notes])
''')
WORDS = ["ink", "quill", "page", "margin", "note", "draft", "letter", "the", "a", "of", "and", "é", "naïve"]


def notes(start: int, stop: int) -> str:
    """JSONL lines ``start``..``stop``, each drawn from its own seed: a line is the same in every file."""
    lines = []
    for i in range(start, stop):
        rng = random.Random(i)
        lines.append(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 60)))}))
    return "\n".join(lines) + "\n"


def shard_steps(home: Path) -> list[list[str]]:
    """The shard_parts steps that succeeded in each run of the instance, oldest run first."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = sorted(instance.get_runs(), key=lambda r: instance.get_run_record_by_id(r.run_id).create_timestamp)
        return [[e.step_key for e in instance.all_logs(r.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)
                 if "_shard_parts[" in e.step_key] for r in runs]


def test_a_team_text_corpus_grows_by_its_new_parts_tokenized_over_steps_and_trains(tmp_path):
    team = team_location(tmp_path, "quill", DEFINITIONS)
    home, cli = team.home, team.cli
    corpus = tmp_path / "notes.jsonl"


    corpus.write_text(notes(0, 300))
    cli("sources", "add", NAME, str(corpus), "--to", "quill/notes.jsonl")
    assert f"{NAME} v1" in cli("train", NAME)
    with corpus.open("a") as f:  # 2 % more documents, after the others: their ids come last
        f.write(notes(300, 306))
    cli("sources", "add", NAME, str(corpus), "--to", "quill/notes.jsonl")
    assert f"{NAME} v2" in cli("train", NAME)

    store = team.store()
    assert list_versions(store, NAME) == [1, 2]
    tags = dataset_tags(store, NAME)
    assert sorted(tags) == [1, 2]
    prefix = f"datasets/{NAME}/shards/"
    before, after = (json.loads(store.get_object(tags[v], prefix + "manifest.json")) for v in (1, 2))
    new = {p["key"] for p in after["parts"]} - {p["key"] for p in before["parts"]}
    gone = {p["key"] for p in before["parts"]} - {p["key"] for p in after["parts"]}
    assert len(after["parts"]) >= 8 and 1 <= len(new) <= 2 and gone <= {before["parts"][-1]["key"]}
    assert sum(p["documents"] for p in after["parts"]) == 306

    def files(manifest: dict, keys: set[str]) -> set[str]:
        return {prefix + path for p in manifest["parts"] if p["key"] in keys for i in p["splits"].values()
                for path in i["shards"]}

    # the second version's commit: the new parts' shard files in, the replaced part's out, the manifest
    diff = {(d.path, d.type) for d in store.diff(tags[1], tags[2], prefix=prefix)}
    assert {path for path, _ in diff} == files(after, new) | files(before, gone) | {prefix + "manifest.json"}
    assert {path for path, kind in diff if kind == "added"} == files(after, new) - files(before, gone)

    # version 1's parts were tokenized over several steps, version 2's new ones in their own
    steps = shard_steps(home)
    assert len(steps) == 2 and len(steps[0]) == -(-len(before["parts"]) // 2) >= 4
    assert len(steps[1]) == -(-len(new) // 2)

    # version 2 trained on that commit, which holds the appended documents' windows
    assert read_lineage(store, NAME, 2)["data"]["dataset_version"] == f"{NAME}-d2"
    assert after["splits"]["train"]["stream_tokens"] > before["splits"]["train"]["stream_tokens"]
    paths = [store.download(tags[2], prefix + e["path"], tmp_path / "read" / e["path"])
             for e in after["splits"]["train"]["shards"]]
    train = open_split(after, paths, "train").gather(np.arange(after["splits"]["train"]["num_samples"]), ["tokens"])
    assert train["tokens"].shape == (after["splits"]["train"]["num_samples"], 33)
