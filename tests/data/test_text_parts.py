"""A text corpus in parts (issue 41, item 3): documents appended, changed or removed make new
shards only in the parts they fall in; the other parts' shards are the published version's files,
neither tokenized nor written again. Language-modelling windows are packed within a part. The BPE
tokenizer is kept from the published version unless a refit is asked for, so with the byte
tokenizer, or the same BPE file, a version built on the previous one is the version a build from
nothing makes, byte for byte."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from assets.kinds.image_store import strip_carried
from assets.kinds.text import TEXT, previous_parts
from assets.kinds.text_store import keeps_tokenizer
from assets.kinds.text_tokens import BYTE_EOS
from assets.sharding import CARRIED, SPLITS, assign_splits
from core.spec import TextCorpus, TextPreprocessing, dataset_pipeline
from tests.pipeline.conftest import failure_messages
from training_runtime.data.shard_format import ShardColumns, columns_from_manifest
from training_runtime.data.split import open_split

WORDS = ["data", "shard", "token", "window", "model", "é", "naïve", "日本", "split", "the", "a", "part"]


def _spec(*, task="language_modeling", tokenizer="byte", vocab_size=400, part_documents=16, refit=False,
          labels=None, seq_len=12):
    return dataset_pipeline(
        "toy", source=TextCorpus(paths=("toy/*",), label_field="label" if labels else None), task=task,
        classes=labels or (), split={"samples_per_shard": 8},
        preprocessing=TextPreprocessing(tokenizer=tokenizer, vocab_size=vocab_size, seq_len=seq_len,
                                        part_documents=part_documents, refit_tokenizer=refit))


def _text(i: int, seed: int = 0, words=WORDS) -> str:
    rng = random.Random(i * 7919 + seed)
    return " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))


def _txt_corpus(ids, seed: int = 0, words=WORDS) -> dict[str, str]:
    return {f"toy/doc_{i:04d}.txt": _text(i, seed, words) for i in ids}


def _jsonl_corpus(n: int, labels=None) -> dict[str, str]:
    lines = [json.dumps({"text": _text(i), **({"label": labels[i % len(labels)]} if labels else {})})
             for i in range(n)]
    return {"toy/lines.jsonl": "\n".join(lines) + "\n"}


def _ingest(spec, folder: Path, files: dict[str, str]) -> Path:
    root = folder / "sources"
    paths = []
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
        paths.append(root / rel)
    raw = TEXT.ingest(spec, paths, root, folder / "documents.parquet")
    assert raw.report.passed, raw.report.failures
    return raw.path


def _shard(spec, files: dict[str, str], folder: Path, previous: dict | None = None, salt: str = "s",
           tokenizer_file: Path | None = None) -> dict:
    raw = _ingest(spec, folder, files)
    return TEXT.shard(spec, raw, folder / "shards", salt=salt, previous=previous, tokenizer_file=tokenizer_file)


def _written(folder: Path) -> set[str]:
    return {p.relative_to(folder / "shards").as_posix() for p in (folder / "shards").rglob("*.bin")}


def _entries(manifest: dict) -> dict[str, str]:
    return {e["path"]: e["sha256"] for i in manifest["splits"].values() for e in i["shards"]}


def _carried(manifest: dict) -> set[str]:
    return {e["path"] for i in manifest["splits"].values() for e in i["shards"] if e.get(CARRIED)}


def _part_files(manifest: dict, keys: set[str]) -> set[str]:
    return {path for p in manifest["parts"] if p["key"] in keys for i in p["splits"].values() for path in i["shards"]}


def _same_version(built_on: dict, built_on_dir: Path, fresh: dict, fresh_dir: Path, previous_dir: Path) -> None:
    """The version built on the previous one is the one made from nothing: the same manifest, and
    every shard file the same bytes (kept ones lie in the previous version's folder)."""
    assert json.dumps(strip_carried(built_on), sort_keys=True) == json.dumps(fresh, sort_keys=True)
    carried = _carried(built_on)
    for path in _entries(fresh):
        mine = (previous_dir if path in carried else built_on_dir) / "shards" / path
        assert mine.read_bytes() == (fresh_dir / "shards" / path).read_bytes(), path


def test_documents_appended_to_a_jsonl_file_rewrite_only_the_last_part(tmp_path):
    spec = _spec()
    first = _shard(spec, _jsonl_corpus(400), tmp_path / "v1")
    assert len(first["parts"]) >= 10 and first["parts"][0]["first_id"] == "toy/lines.jsonl:1"
    assert sum(p["documents"] for p in first["parts"]) == 400

    second = _shard(spec, _jsonl_corpus(412), tmp_path / "v2", previous=first)

    old = {p["key"] for p in first["parts"]}
    kept = {p["key"] for p in second["parts"]} & old
    assert old - kept <= {first["parts"][-1]["key"]}, "an append rewrote parts before the last"
    # only the new parts' shards were written; the kept ones are the first version's, byte for byte
    assert _carried(second) == _part_files(second, kept)
    assert _written(tmp_path / "v2") == set(_entries(second)) - _carried(second)
    assert all(_entries(first)[path] == sha for path, sha in _entries(second).items() if path in _carried(second))
    fresh = _shard(spec, _jsonl_corpus(412), tmp_path / "fresh")
    _same_version(second, tmp_path / "v2", fresh, tmp_path / "fresh", tmp_path / "v1")
    # the shard checks judge the kept shards by their parts' records: their files are not here to read
    assert not (tmp_path / "v2/shards" / next(iter(_carried(second)))).exists()
    assert TEXT.check_shards(spec, second, tmp_path / "v2/shards").passed


def test_a_changed_and_a_removed_document_rewrite_only_their_parts(tmp_path):
    spec = _spec()
    corpus = _txt_corpus(range(400))
    first = _shard(spec, corpus, tmp_path / "v1")
    edited = {k: v for k, v in corpus.items() if k != "toy/doc_0300.txt"}
    edited["toy/doc_0100.txt"] += " changed"

    second = _shard(spec, edited, tmp_path / "v2", previous=first)

    made = [p for p in second["parts"] if p["key"] not in {q["key"] for q in first["parts"]}]
    holders = [p for p in first["parts"] if p["first_id"] <= "toy/doc_0100.txt" <= p["last_id"]
               or p["first_id"] <= "toy/doc_0300.txt" <= p["last_id"]]
    assert len(holders) == 2 and 2 <= len(made) <= len(holders) + 2 and len(made) < len(first["parts"]) // 3
    assert _written(tmp_path / "v2") == _part_files(second, {p["key"] for p in made})
    fresh = _shard(spec, edited, tmp_path / "fresh")
    _same_version(second, tmp_path / "v2", fresh, tmp_path / "fresh", tmp_path / "v1")


def test_another_salt_keeps_no_part_and_a_manifest_made_before_parts_keeps_none(tmp_path):
    spec = _spec()
    corpus = _txt_corpus(range(120))
    first = _shard(spec, corpus, tmp_path / "v1")
    other = _shard(spec, corpus, tmp_path / "v2", previous=first, salt="other parameters")
    assert not _carried(other) and not {p["key"] for p in other["parts"]} & {p["key"] for p in first["parts"]}
    old_style = {k: v for k, v in first.items() if k != "parts"}  # what versions before parts published
    assert previous_parts(old_style) == {}
    again = _shard(spec, corpus, tmp_path / "v3", previous=old_style)
    assert not _carried(again) and again == first


def test_a_part_key_covers_the_tokenizer_the_text_and_the_label(tmp_path):
    labels = ("ham", "spam")
    spec = _spec(task="classification", labels=labels)
    corpus = _jsonl_corpus(60, labels)
    first = _shard(spec, corpus, tmp_path / "v1")
    relabelled = dict(corpus)
    lines = relabelled["toy/lines.jsonl"].splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "label": "spam" if "ham" in lines[0] else "ham"})
    relabelled["toy/lines.jsonl"] = "\n".join(lines) + "\n"
    second = _shard(spec, relabelled, tmp_path / "v2", previous=first)
    assert [p["key"] == q["key"] for p, q in zip(first["parts"], second["parts"])][:1] == [False]
    assert all(p["key"] == q["key"] for p, q in zip(first["parts"][1:], second["parts"][1:]))
    # the kept parts' shards (not in v2's folder) are judged by their records: labels and token ids
    assert _carried(second) and TEXT.check_shards(spec, second, tmp_path / "v2/shards").passed
    broken = json.loads(json.dumps(second))
    broken["parts"][-1]["splits"]["train"]["max_label"] = 5
    assert "shards: expect_column_values_to_be_between(max_label)" in "\n".join(
        TEXT.check_shards(spec, broken, tmp_path / "v2/shards").failures)
    bpe = _shard(_spec(task="classification", labels=labels, tokenizer="bpe"), corpus, tmp_path / "bpe")
    assert not {p["key"] for p in bpe["parts"]} & {p["key"] for p in first["parts"]}
    assert [p["name"] for p in bpe["parts"]] == [p["name"] for p in first["parts"]]  # names: the members only


def test_windows_are_packed_within_a_part(tmp_path):
    spec = _spec(seq_len=12)
    corpus = _txt_corpus(range(200))
    manifest = _shard(spec, corpus, tmp_path / "v1")
    columns = columns_from_manifest(manifest)
    shards = {e["path"]: e for i in manifest["splits"].values() for e in i["shards"]}
    for part in manifest["parts"]:
        docs = [corpus[f"toy/doc_{i:04d}.txt"] for i in range(int(part["first_id"][8:12]), int(part["last_id"][8:12]) + 1)]
        assert len(docs) == part["documents"]
        for split, info in part["splits"].items():
            # each split of each part is a stream of its own: an eos between two of its documents,
            # and fewer than one window (13 tokens) dropped at its end
            assert info["num_tokens"] + info["dropped_tokens"] == info["stream_tokens"] and info["dropped_tokens"] < 13
            got = b"".join(bytes(0 if t == BYTE_EOS else int(t) for t in ShardColumns(
                tmp_path / "v1/shards" / path, shards[path], columns).arrays["tokens"].ravel()) for path in info["shards"])
            assert len(got) == info["num_tokens"]
            ids = [shards[path] for path in info["shards"]]
            assert all(path.startswith(f"{split}/{part['name']}-") for path in info["shards"]) and len(ids) == len(
                info["shards"])
        stream = sum(part["splits"][s]["stream_tokens"] for s in SPLITS)
        non_empty = sum(part["splits"][s]["num_documents"] > 0 for s in SPLITS)
        assert stream == sum(len(d.encode()) for d in docs) + len(docs) - non_empty
    for split in SPLITS:
        assert manifest["splits"][split]["dropped_tokens"] == sum(p["splits"][split]["dropped_tokens"]
                                                                  for p in manifest["parts"])
    # the trainer's reader takes a manifest in parts as any other: every window of the split
    train = manifest["splits"]["train"]
    split = open_split(manifest, [tmp_path / "v1/shards" / e["path"] for e in train["shards"]], "train")
    assert split.num_samples == train["num_samples"]
    tokens = split.gather(np.arange(split.num_samples), ["tokens"])["tokens"]
    assert tokens.shape == (train["num_samples"], 13)


def test_a_document_keeps_its_split_when_others_are_added(tmp_path):
    labels = ("ham", "spam")
    spec = _spec(task="classification", labels=labels)

    def split_of(manifest: dict, folder: Path) -> dict[str, str]:
        columns = columns_from_manifest(manifest)
        found = {}
        for split, info in manifest["splits"].items():
            for e in info["shards"]:
                shard = ShardColumns(folder / "shards" / e["path"], e, columns)
                found.update({shard.value("id", i).decode(): split for i in range(shard.num_samples)})
        return found

    first = _shard(spec, _jsonl_corpus(200, labels), tmp_path / "v1")
    grown = _shard(spec, _jsonl_corpus(300, labels), tmp_path / "fresh")  # from nothing: every file is here
    before, after = split_of(first, tmp_path / "v1"), split_of(grown, tmp_path / "fresh")
    assert len(before) == 200 and len(after) == 300
    assert {i: after[i] for i in before} == before


def test_a_bpe_tokenizer_is_kept_across_versions_unless_a_refit_is_asked_for(tmp_path):
    spec = _spec(tokenizer="bpe", vocab_size=400)
    first = _shard(spec, _txt_corpus(range(300)), tmp_path / "v1")
    tokenizer = tmp_path / "v1/shards/tokenizer.json"
    assert first["tokenizer"]["sha256"] and keeps_tokenizer(spec.preprocessing, first)
    grown = _txt_corpus(range(300)) | _txt_corpus(range(300, 340), seed=1, words=["zebra", "quokka", "axolotl"])

    # kept (what the shards asset does when keeps_tokenizer holds): the same file, so the parts the
    # new documents leave alone are kept too, and the version is the one made from nothing with it
    second = _shard(spec, grown, tmp_path / "v2", previous=first, tokenizer_file=tokenizer)
    assert second["tokenizer"] == first["tokenizer"]
    assert (tmp_path / "v2/shards/tokenizer.json").read_bytes() == tokenizer.read_bytes()
    kept = {p["key"] for p in second["parts"]} & {p["key"] for p in first["parts"]}
    assert len(kept) >= len(first["parts"]) - 1
    fresh = _shard(spec, grown, tmp_path / "fresh", tokenizer_file=tokenizer)
    _same_version(second, tmp_path / "v2", fresh, tmp_path / "fresh", tmp_path / "v1")

    # a refit, or another vocabulary or function, trains on the grown training split: new tokens,
    # every part new
    for changed in (_spec(tokenizer="bpe", vocab_size=400, refit=True), _spec(tokenizer="bpe", vocab_size=500)):
        assert not keeps_tokenizer(changed.preprocessing, first)
    assert not keeps_tokenizer(_spec().preprocessing, first)  # byte: nothing to keep
    refit = _shard(_spec(tokenizer="bpe", vocab_size=400, refit=True), grown, tmp_path / "refit", previous=first)
    assert refit["tokenizer"]["sha256"] != first["tokenizer"]["sha256"]
    assert not _carried(refit) and not {p["key"] for p in refit["parts"]} & {p["key"] for p in first["parts"]}


def test_a_part_size_below_one_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="preprocessing.part_documents"):
        _spec(part_documents=0)


# ---------------------------------------------------------------- through the dataset's job
def test_a_version_with_appended_documents_commits_only_the_new_parts_shards(platform):
    """Two versions of a JSONL corpus through the dataset's job on a local platform: the second's
    commit adds and removes the shard files of the parts the new lines fall in, and the manifest."""
    from core.datasets import dataset_tags

    spec = _spec()
    folder = platform.sources / "toy"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lines.jsonl").write_text(_jsonl_corpus(400)["toy/lines.jsonl"])
    first = platform.run(spec)
    assert first.success, failure_messages(first)
    (folder / "lines.jsonl").write_text(_jsonl_corpus(406)["toy/lines.jsonl"])
    second = platform.run(spec)
    assert second.success, failure_messages(second)

    store = platform.store()
    tags = dataset_tags(store, "toy")
    assert sorted(tags) == [1, 2]
    prefix = "datasets/toy/shards/"
    before, after = (json.loads(store.get_object(tags[v], prefix + "manifest.json")) for v in (1, 2))
    assert not any(CARRIED in e for i in after["splits"].values() for e in i["shards"])
    new = {p["key"] for p in after["parts"]} - {p["key"] for p in before["parts"]}
    gone = {p["key"] for p in before["parts"]} - {p["key"] for p in after["parts"]}
    assert gone <= {before["parts"][-1]["key"]} and 1 <= len(new) <= 2 and len(after["parts"]) >= 10

    def files(manifest: dict, keys: set[str]) -> set[str]:
        return {prefix + path for path in _part_files(manifest, keys)}

    diff = {(d.path, d.type) for d in store.diff(tags[1], tags[2], prefix=prefix)}
    assert {path for path, _ in diff} == files(after, new) | files(before, gone) | {prefix + "manifest.json"}
    assert {path for path, kind in diff if kind == "added"} == files(after, new) - files(before, gone)
    logs = [e.message for e in platform.instance.all_logs(second.run_id) if "part(s) sharded" in (e.message or "")]
    assert logs and f"{len(new)} of {len(after['parts'])} part(s) sharded" in logs[0]
    read = len(files(after, new))
    assert f"the shard checks read {read} shard file(s) and judged {len(_entries(after)) - read} kept" in logs[0]
    raw = pq.read_table(store.download(tags[2], "datasets/toy/raw/documents.parquet", platform.root / "raw.parquet"))
    assert sum(p["documents"] for p in after["parts"]) == raw.num_rows == 406
    # v2 read the 6 appended lines alone (assets/kinds/text_append.py), and its raw copy is a whole read's
    ingests = [[e.message for e in platform.instance.all_logs(run.run_id) if "toy: " in (e.message or "")
                and "document" in e.message and " read" in e.message] for run in (first, second)]
    assert any("every document read (400): no published version with this run's parameters and code to build on"
               in m for m in ingests[0]), ingests[0]
    assert any("only the new documents read: 6 new document(s) of toy/lines.jsonl (bytes" in m
               for m in ingests[1]), ingests[1]
    whole = TEXT.ingest(spec, [folder / "lines.jsonl"], platform.sources, platform.root / "whole.parquet")
    assert (platform.root / "raw.parquet").read_bytes() == whole.path.read_bytes()
    record = json.loads(store.get_object(tags[2], "datasets/toy/raw/ingest.json"))  # what v3 would build on
    assert record["documents"] == 406 and record["files"][0]["lines"] == 406 and record["files"][0]["ends_line"]


def test_a_new_version_of_a_bpe_corpus_keeps_the_published_tokenizer_and_its_parts(platform):
    """The shards asset takes the published tokenizer.json from main (assets/kinds/text_store.py):
    the second version's tokenizer is the first's, unchanged in the commit, and only the parts the
    new document falls in are new."""
    from core.datasets import dataset_tags

    spec = _spec(tokenizer="bpe", vocab_size=400)
    folder = platform.sources / "toy"
    for rel, text in _txt_corpus(range(200)).items():
        (platform.sources / rel).parent.mkdir(parents=True, exist_ok=True)
        (platform.sources / rel).write_text(text)
    first = platform.run(spec)
    assert first.success, failure_messages(first)
    # words the tokenizer never merged, in the training split: a tokenizer trained again would differ
    (folder / "doc_0200.txt").write_text("zebra quokka axolotl " * 30)
    assert assign_splits(pd.Series(["toy/doc_0200.txt"]), spec.split.seed, (0.8, 0.1, 0.1))[0] == 0
    second = platform.run(spec)
    assert second.success, failure_messages(second)

    store = platform.store()
    tags = dataset_tags(store, "toy")
    prefix = "datasets/toy/shards/"
    before, after = (json.loads(store.get_object(tags[v], prefix + "manifest.json")) for v in (1, 2))
    assert after["tokenizer"] == before["tokenizer"]
    assert store.get_object(tags[2], prefix + "tokenizer.json") == store.get_object(tags[1], prefix + "tokenizer.json")
    diff = {d.path for d in store.diff(tags[1], tags[2], prefix=prefix)}
    new = {p["key"] for p in after["parts"]} - {p["key"] for p in before["parts"]}
    assert prefix + "tokenizer.json" not in diff and 1 <= len(new) <= 2 < len(after["parts"])


def test_the_runtime_reads_a_manifest_made_before_parts_as_one_in_parts(tmp_path):
    """Versions published before parts packed a split's whole stream into ``<split>/<n>.bin``, with
    no ``parts``: the trainer's reader and DataInfo take both alike, with no dagster import."""
    from assets.kinds.text_pack import ShardBuffer, WindowPacker, lm_columns
    from assets.kinds.text_tokens import ByteTokenizer
    from training_runtime.data.info import DataInfo

    spec = _spec()
    corpus = _txt_corpus(range(120))
    manifest = _shard(spec, corpus, tmp_path / "parts")
    ids = sorted(corpus)
    codes = assign_splits(pd.Series(ids), spec.split.seed, (0.8, 0.1, 0.1))
    old_dir = tmp_path / "before-parts"
    columns = lm_columns(12, "uint16")
    old = {k: v for k, v in manifest.items() if k not in ("parts", "part_documents")}
    old["splits"] = {}
    for code, split in enumerate(SPLITS):  # one stream per split, as the shards asset used to write
        members = [i for i, c in zip(ids, codes) if c == code]
        packer = WindowPacker(13, ByteTokenizer.eos_id, "uint16")
        buffer = ShardBuffer(old_dir, split, columns, manifest["samples_per_shard"])
        buffer.add(packer.add(ByteTokenizer().encode_batch([corpus[i] for i in members]), members))
        shards = buffer.finish()
        old["splits"][split] = {"num_samples": sum(e["num_samples"] for e in shards), "shards": shards}
    assert old["splits"]["train"]["shards"][0]["path"] == "train/00000.bin"
    assert DataInfo.from_manifest(old) == DataInfo.from_manifest(manifest)
    for made, folder in ((old, old_dir), (manifest, tmp_path / "parts/shards")):
        train = made["splits"]["train"]
        split = open_split(made, [folder / e["path"] for e in train["shards"]], "train")
        tokens = split.gather(np.arange(split.num_samples), ["tokens"])["tokens"]
        assert tokens.shape == (train["num_samples"], 13) and split.num_samples > 0
    # packing within parts drops at most a partial window per part and split more than one stream did
    lost = old["splits"]["train"]["num_samples"] - manifest["splits"]["train"]["num_samples"]
    assert 0 <= lost <= len(manifest["parts"])
