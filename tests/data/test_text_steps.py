"""A text corpus's shards over Dagster steps (issue 41, items 1 and 2; assets/text_shard_steps.py):
a plan step settles the tokenizer and the parts, mapped steps tokenize groups of the new parts,
and a publish step makes one commit.

The unit tests build a version the steps' way by hand (the plan, then each group in a folder of
its own from the raw copy, then the assembly) and hold it to the single-step build, byte for byte,
with the byte tokenizer and with BPE, from nothing and on a published version; a group reads only
the raw copy's row groups its documents lie in. The pipeline tests run the dataset's job: the
parts are tokenized in several steps and published in one commit equal to a single-step build,
and a run whose group failed is re-executed from the failure, redoing that group alone."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from assets.kinds.image_store import strip_carried
from assets.kinds.text import TEXT, TextSharder, part_from_dict, previous_parts, text_manifest, tokenizer_of
from assets.kinds.text_store import part_salt
from assets.kinds.text_tokens import TOKENIZER_FILE
from assets.sharding import CARRIED
from assets.text_shard_steps import made_parts, plan_groups
from core.datasets import DATA_KEY, dataset_tags
from core.spec import TextCorpus, TextPreprocessing, dataset_pipeline
from pipelines.definitions import build_definitions, training_job_name
from pipelines.profiles import Profile
from tests.data.test_text_parts import _ingest, _txt_corpus
from tests.pipeline.conftest import Platform, failure_messages

STAMPED = ("source_commit", "location", DATA_KEY)  # what the shards asset adds: where the data came from


def _spec(*, tokenizer="byte", parts_per_step=2, part_documents=16, docs_per_chunk=2048):
    return dataset_pipeline(
        "toy", source=TextCorpus(paths=("toy/*",), parts_per_step=parts_per_step, docs_per_chunk=docs_per_chunk),
        task="language_modeling", split={"samples_per_shard": 8},
        preprocessing=TextPreprocessing(tokenizer=tokenizer, vocab_size=400, seq_len=12,
                                        part_documents=part_documents))


def _by_steps(spec, raw: Path, folder: Path, previous: dict | None = None,
              tokenizer_file: Path | None = None) -> tuple[dict, list[list[dict]]]:
    """The version the shards asset's steps make: the plan in ``folder/plan``, group i's files in
    ``folder/group-i`` (each from a sharder of its own, as a step in a pod of its own), then the
    assembly. Returns (the manifest with the kept parts marked, the groups)."""
    planned, _ = TextSharder(spec, raw, folder / "plan", salt="s", previous=previous,
                             tokenizer_file=tokenizer_file).plan()
    info = planned.header["tokenizer"]
    tokenizer_path = folder / "plan" / TOKENIZER_FILE if planned.files else None
    groups = plan_groups(planned, set(previous_parts(previous)), spec.source.parts_per_step)
    made = []
    for i, group in enumerate(groups):
        sharder = TextSharder(spec, raw, folder / f"group-{i}")
        written = sharder.write_parts([part_from_dict(p) for p in group], set(), tokenizer_of(info, tokenizer_path))
        records, entries = zip(*(written[p["key"]] for p in group))
        made.append({"branch": f"group-{i}", "failures": [], "records": list(records), "entries": list(entries)})
    by_key, failures, staged = made_parts(made, "")
    assert not failures
    manifest = text_manifest(planned, {**previous_parts(previous), **by_key})
    # every new shard was written by exactly the group that holds its part
    assert staged == {e["path"]: f"group-{i}" for i, g in enumerate(made) for es in g["entries"]
                      for split in es.values() for e in split}
    return manifest, groups


def _assert_same_bytes(manifest: dict, files: dict[str, Path], single: dict, single_dir: Path) -> None:
    assert json.dumps(strip_carried(manifest), sort_keys=True) == json.dumps(single, sort_keys=True)
    shards = [e["path"] for info in single["splits"].values() for e in info["shards"]] + single["files"]
    assert sorted(files) == sorted(shards)
    for path in shards:
        assert files[path].read_bytes() == (single_dir / path).read_bytes(), path


def _group_files(folder: Path, groups: int, manifest: dict, previous_dir: Path | None = None) -> dict[str, Path]:
    """Where each file of the version lies: a group's folder, the plan's (the tokenizer) or, for a
    kept part's shard, the previous version's."""
    out = {}
    for i in range(groups):
        out.update({p.relative_to(folder / f"group-{i}").as_posix(): p
                    for p in (folder / f"group-{i}").rglob("*.bin")})
    out.update({f: folder / "plan" / f for f in manifest["files"]})
    if previous_dir is not None:
        out.update({e["path"]: previous_dir / e["path"] for info in manifest["splits"].values()
                    for e in info["shards"] if e.get(CARRIED)})
    return out


def test_groups_hold_the_new_parts_in_raw_copy_order_parts_per_step_each(tmp_path):
    spec = _spec(parts_per_step=3)
    raw = _ingest(spec, tmp_path, _txt_corpus(range(300)))
    planned, _ = TextSharder(spec, raw, tmp_path / "plan", salt="s").plan()
    keys = [p.key for p in planned.parts]
    assert len(keys) >= 10
    kept = set(keys[2:5]) | {keys[-1]}

    groups = plan_groups(planned, kept, 3)

    assert [p["key"] for g in groups for p in g] == [k for k in keys if k not in kept]
    assert [len(g) for g in groups[:-1]] == [3] * (len(groups) - 1) and 1 <= len(groups[-1]) <= 3
    assert plan_groups(planned, set(keys), 3) == []  # nothing new: no step
    by_name = {p.name: p for p in planned.parts}
    assert all(part_from_dict(p) == by_name[p["name"]] for g in groups for p in g)  # what a step is handed


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_parts_tokenized_in_separate_steps_equal_a_single_step_build_byte_for_byte(tmp_path, tokenizer):
    spec = _spec(tokenizer=tokenizer, docs_per_chunk=32)
    raw = _ingest(spec, tmp_path, _txt_corpus(range(300)))
    single = TEXT.shard(spec, raw, tmp_path / "single", salt="s")

    manifest, groups = _by_steps(spec, raw, tmp_path / "steps")

    assert len(groups) >= 5
    _assert_same_bytes(manifest, _group_files(tmp_path / "steps", len(groups), manifest), single, tmp_path / "single")
    assert (TOKENIZER_FILE in manifest["files"]) == (tokenizer == "bpe")


def test_steps_on_a_published_version_tokenize_only_the_new_parts_and_equal_a_build_from_nothing(tmp_path):
    spec = _spec(tokenizer="bpe")
    first_raw = _ingest(spec, tmp_path / "v1", _txt_corpus(range(300)))
    first = TEXT.shard(spec, first_raw, tmp_path / "v1" / "shards", salt="s")
    corpus = _txt_corpus(range(310))  # 10 documents added after the others
    corpus.pop("toy/doc_0100.txt")  # and one removed
    raw = _ingest(spec, tmp_path / "v2", corpus)
    fresh = TEXT.shard(spec, raw, tmp_path / "fresh", salt="s", tokenizer_file=tmp_path / "v1/shards" / TOKENIZER_FILE)

    manifest, groups = _by_steps(spec, raw, tmp_path / "steps", previous=first,
                                 tokenizer_file=tmp_path / "v1/shards" / TOKENIZER_FILE)

    new = {p["key"] for g in groups for p in g}
    assert new == {p["key"] for p in manifest["parts"]} - {p["key"] for p in first["parts"]}
    assert 2 <= len(new) <= 4 < len(manifest["parts"])
    _assert_same_bytes(manifest, _group_files(tmp_path / "steps", len(groups), manifest, tmp_path / "v1/shards"),
                       fresh, tmp_path / "fresh")


def test_a_step_reads_only_the_row_groups_that_hold_its_documents(tmp_path, monkeypatch):
    spec = _spec(docs_per_chunk=20, parts_per_step=1)
    raw = _ingest(spec, tmp_path, _txt_corpus(range(300)))
    assert pq.ParquetFile(raw).num_row_groups == 15
    planned, tokenizer = TextSharder(spec, raw, tmp_path / "plan", salt="s").plan()
    read: list[int] = []
    original = pq.ParquetFile.read_row_group

    def counted(self, i, *args, **kwargs):
        read.append(i)
        return original(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    part = planned.parts[len(planned.parts) // 2]
    TextSharder(spec, raw, tmp_path / "one").write_parts([part], set(), tokenizer)

    assert read == list(range(part.start // 20, (part.stop - 1) // 20 + 1))
    assert len(read) < 15


def test_how_many_parts_a_step_takes_is_not_part_of_the_data_key_and_must_be_at_least_one():
    from assets.data_key import parameters

    assert parameters(_spec(parts_per_step=1)) == parameters(_spec(parts_per_step=64))
    assert TextCorpus(paths=("x/*",)).parts_per_step == 64
    with pytest.raises(ValueError, match=r"source\.parts_per_step.*at least 1"):
        _spec(parts_per_step=0)


# ---------------------------------------------------------------- through the dataset's job
def _write_corpus(sources: Path, ids) -> None:
    for rel, text in _txt_corpus(ids).items():
        (sources / rel).parent.mkdir(parents=True, exist_ok=True)
        (sources / rel).write_text(text)


def _shard_steps(events) -> list[str]:
    return [e.step_key for e in events if e.is_step_success and "_shard_parts[" in e.step_key]


def _published_equals_a_single_step_build(store, spec, tmp: Path) -> dict:
    """main's shards are, byte for byte, what one TextKind.shard call makes of the raw copy."""
    prefix = "datasets/toy/shards/"
    published = json.loads(store.get_object("main", prefix + "manifest.json"))
    raw = store.download("main", "datasets/toy/raw/documents.parquet", tmp / "documents.parquet")
    single = TEXT.shard(spec, raw, tmp / "single", salt=part_salt(published[DATA_KEY]))
    assert {k: v for k, v in published.items() if k not in STAMPED} == single
    paths = [e["path"] for info in single["splits"].values() for e in info["shards"]] + single["files"]
    for path in paths:
        assert store.get_object("main", prefix + path) == (tmp / "single" / path).read_bytes(), path
    on_main = {o.path[len(prefix):] for o in store.list_objects("main", prefix=prefix)}
    assert on_main == set(paths) | {"manifest.json"}
    return published


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_a_corpus_in_parts_is_tokenized_in_several_steps_and_published_in_one_commit(platform, tokenizer):
    spec = _spec(tokenizer=tokenizer, parts_per_step=3)
    _write_corpus(platform.sources, range(200))

    result = platform.run(spec)

    assert result.success, failure_messages(result)
    store = platform.store()
    manifest = _published_equals_a_single_step_build(store, spec, platform.root / "check")
    steps = _shard_steps(result.all_events)
    assert len(steps) == -(-len(manifest["parts"]) // 3) >= 3
    shard_commits = [c for c in store.log(f"run-{result.run_id}") if c.message.startswith("Shard toy")]
    assert len(shard_commits) == 1
    # that commit (not the plan, not a step) brought every shard file and the manifest into the history
    added = {d.path for d in store.diff(shard_commits[0].parents[0], shard_commits[0].id, prefix="datasets/toy/shards/")}
    assert len(added) == sum(len(i["shards"]) for i in manifest["splits"].values()) + len(manifest["files"]) + 1
    logs = [e.user_message for e in platform.instance.all_logs(result.run_id)]
    assert any(f"{len(manifest['parts'])} of {len(manifest['parts'])} part(s) to tokenize, in {len(steps)} step(s)"
               in m for m in logs), logs
    # each step read its documents' row groups by byte range and says how much of the raw copy that was
    size = store.stat_object("main", "datasets/toy/raw/documents.parquet").size_bytes
    read = [re.search(r"\((\d+) of the raw copy's (\d+) byte\(s\) read in \d+ ranged request", m) for m in logs
            if "part(s) tokenized" in m]
    assert len(read) == len(steps) and all(r and 0 < int(r.group(1)) <= int(r.group(2)) == size for r in read), logs


# A job dagster can rebuild by reference: a re-execution from failure needs one, and the outputs
# of the first run in the instance's storage (execute_job's default IO manager), not in memory.
DATA_ROOT_VAR = "TEXT_STEPS_TEST_DATA_ROOT"


def steps_job() -> dg.JobDefinition:
    spec = _spec(parts_per_step=2)
    profile = Profile(name="local", data_root=Path(os.environ[DATA_ROOT_VAR]))
    return build_definitions(profile, [spec], with_yaml=False).resolve_job_def(training_job_name(spec))


def test_a_failed_group_is_re_executed_alone_and_the_version_is_one_commit(tmp_path, monkeypatch):
    platform = Platform(tmp_path)
    monkeypatch.setenv(DATA_ROOT_VAR, str(platform.profile.data_root))
    _write_corpus(platform.sources, range(200))
    spec = _spec(parts_per_step=2)
    calls: list[tuple[str, ...]] = []
    broken: list[tuple[str, ...]] = []
    write_parts = TextSharder.write_parts

    def second_group_fails_once(self, parts, kept, tokenizer):
        names = tuple(p.name for p in parts)
        calls.append(names)
        if len(calls) == 2 and not broken:  # a problem no retry fixes: the run fails
            broken.append(names)
            raise ValueError("the disk under this step went away")
        return write_parts(self, parts, kept, tokenizer)

    monkeypatch.setattr(TextSharder, "write_parts", second_group_fails_once)
    job = dg.reconstructable(steps_job)
    with platform.instance:
        with dg.execute_job(job, instance=platform.instance, raise_on_error=False) as first:
            assert not first.success
            failed = [e.step_key for e in first.all_events if e.is_step_failure]
            first_steps = _shard_steps(first.all_events)
            first_id = first.run_id
        store = platform.store()
        assert len(failed) == 1 and "_shard_parts[" in failed[0]
        assert dataset_tags(store, "toy") == {}  # nothing published
        assert not store.list_objects("main", prefix="datasets/toy/shards/")
        assert len(first_steps) >= 3 and len(calls) == len(first_steps) + 1

        first_calls = list(calls)  # each group once, the failed one included
        calls.clear()
        options = dg.ReexecutionOptions.from_failure(first_id, platform.instance)
        with dg.execute_job(job, instance=platform.instance, raise_on_error=False,
                            reexecution_options=options) as again:
            assert again.success, [e.message for e in again.all_events if e.is_failure]
            ran = [e.step_key for e in again.all_events if e.is_step_success]
            run_id = again.run_id

        # only the failed group (and publish after it) ran again: its parts, tokenized once more
        assert _shard_steps(again.all_events) == failed and calls == broken
        assert not any(k.endswith("_plan") or k.endswith("raw_dataset") for k in ran), ran
        manifest = _published_equals_a_single_step_build(store, spec, tmp_path / "check")
        assert sorted(n for c in first_calls for n in c) == sorted(p["name"] for p in manifest["parts"])
        shard_commits = [c for c in store.log(f"run-{run_id}") if c.message.startswith("Shard toy")]
        assert len(shard_commits) == 1
        assert dataset_tags(store, "toy").keys() == {1}
        # the version holds its raw copy, though the raw commit is on the first run's branch
        raw_path = "datasets/toy/raw/documents.parquet"
        assert store.get_object("main", raw_path) == store.get_object(f"run-{first_id}", raw_path)


def test_a_new_version_with_no_new_part_runs_no_step_and_publishes_the_kept_parts(platform):
    """A JSONL field the corpus does not read changes the files (so the data key: no reuse) but no
    document: the plan hands out no group, and publish still makes the version, every part kept."""
    spec = dataclasses.replace(_spec(), source=TextCorpus(paths=("toy/*.jsonl",), parts_per_step=2))
    lines = [{"text": f"document number {i} " * 5} for i in range(200)]
    (platform.sources / "toy").mkdir(parents=True)
    (platform.sources / "toy/a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    first = platform.run(spec)
    assert first.success, failure_messages(first)
    lines[3]["note"] = "a field no document reads"
    (platform.sources / "toy/a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    second = platform.run(spec)

    assert second.success, failure_messages(second)
    assert _shard_steps(second.all_events) == []
    store = platform.store()
    tags = dataset_tags(store, "toy")
    assert sorted(tags) == [1, 2]
    prefix = "datasets/toy/shards/"
    before, after = (json.loads(store.get_object(tags[v], prefix + "manifest.json")) for v in (1, 2))
    assert [p["key"] for p in after["parts"]] == [p["key"] for p in before["parts"]]
    assert {d.path for d in store.diff(tags[1], tags[2], prefix=prefix)} == {prefix + "manifest.json"}
