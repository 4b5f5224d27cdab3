"""Text corpora as data (assets/kinds/text*.py): tokenizing and packing, the BPE fitted on the
training split only, determinism, the code hash of a user function; then the dataset pipeline's
job run in process: Python's pydoc topics as a BPE language-modelling corpus, a JSONL
classification corpus, and every kind of bad input refused with the file and the problem named."""

from __future__ import annotations

import hashlib
import importlib
import json
import random
import string
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from assets.kinds import data_kind
from assets.kinds.text import TEXT
from assets.kinds.text_pack import ShardBuffer, WindowPacker, classification_samples, lm_columns
from assets.kinds.text_tokens import BYTE_EOS, BYTE_PAD, BpeTokenizer, ByteTokenizer, token_dtype
from assets.sharding import SPLITS, assign_splits
from core.datasets import dataset_tags
from core.spec import TextCorpus, TextPreprocessing, dataset_pipeline
from pipelines.models.pydoc_corpus import pydoc_corpus, pydoc_topics, write_pydoc_source
from tests.pipeline.conftest import Platform, failure_messages
from training_runtime.data.shard_format import ShardColumns, columns_from_manifest


def corpus_spec(name="toy", *, task="language_modeling", tokenizer="byte", seq_len=16, vocab_size=4096,
                function=None, labels=None, samples_per_shard=8, **source):
    return dataset_pipeline(
        name, source=TextCorpus(paths=(f"{name}/*",), label_field="label" if labels else None, **source),
        task=task, classes=labels or (), split={"samples_per_shard": samples_per_shard},
        preprocessing=TextPreprocessing(tokenizer=tokenizer, vocab_size=vocab_size, seq_len=seq_len,
                                        function=function))


def write_files(root: Path, files: dict[str, bytes | str]) -> list[Path]:
    paths = []
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        paths.append(path)
    return paths


def ingest(spec, tmp_path: Path, files: dict[str, bytes | str]):
    root = tmp_path / "sources"
    return TEXT.ingest(spec, write_files(root, files), root, tmp_path / "documents.parquet")


def words_corpus(n: int, seed: int = 0) -> dict[str, str]:
    rng = random.Random(seed)
    vocabulary = ["data", "shard", "token", "window", "model", "é", "naïve", "日本", "split", "the", "a"]
    return {f"toy/doc_{i:03d}.txt": " ".join(rng.choice(vocabulary) for _ in range(rng.randint(5, 60)))
            for i in range(n)}


def read_split_tokens(manifest: dict, out_dir: Path, split: str) -> tuple[np.ndarray, list[str]]:
    columns = columns_from_manifest(manifest)
    tokens, ids = [], []
    for entry in manifest["splits"][split]["shards"]:
        shard = ShardColumns(out_dir / entry["path"], entry, columns)
        tokens.append(np.array(shard.arrays["tokens"]))
        ids += [shard.value("id", i).decode() for i in range(shard.num_samples)]
    return np.concatenate(tokens), ids


# --- tokenizing and packing ------------------------------------------------------------------------

def test_byte_tokens_are_utf8_bytes_with_eos_and_pad_after_them():
    tok = ByteTokenizer()
    (ids,) = tok.encode_batch(["hé!"])
    assert ids.tolist() == [104, 0xC3, 0xA9, 33]
    assert (tok.eos_id, tok.pad_id, tok.vocab_size) == (BYTE_EOS, BYTE_PAD, 258) == (256, 257, 258)
    assert token_dtype(258) == "uint16" and token_dtype(65_536) == "uint16" and token_dtype(65_537) == "int32"


def test_packing_fills_every_window_and_loses_only_the_counted_remainder():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 250, size=int(n), dtype=np.uint16) for n in rng.integers(0, 40, size=30)]
    ids = [f"d{i:02d}" for i in range(len(docs))]
    packer = WindowPacker(width=7, eos=BYTE_EOS, dtype="uint16")
    windows, window_ids = [], []
    for start in range(0, len(docs), 11):  # documents arrive in batches, as row groups do
        out = packer.add(docs[start:start + 11], ids[start:start + 11])
        windows.append(out["tokens"])
        window_ids += out["id"]
    stream, owner = [], []
    for i, doc in enumerate(docs):
        part = ([BYTE_EOS] if i else []) + doc.tolist()
        stream += part
        owner += [ids[i]] * len(part)
    packed = np.concatenate(windows)
    assert packed.shape[1] == 7 and packed.dtype == np.uint16
    assert packed.ravel().tolist() + packer.carry.tolist() == stream  # in order, nothing lost, no padding
    assert packer.dropped_tokens == len(stream) % 7 and packer.stream_tokens == len(stream)
    assert window_ids == [owner[i * 7] for i in range(len(packed))]  # the document of each window's first token
    assert packed.ravel().tolist().count(BYTE_EOS) + packer.carry.tolist().count(BYTE_EOS) == len(docs) - 1


def test_classification_samples_are_cut_or_padded_to_seq_len(tmp_path):
    docs = [np.array([5, 6, 7, 8, 9]), np.array([1, 2]), np.array([], dtype=np.int64)]
    samples = classification_samples(docs, [2, 0, 1], ["a", "b", "c"], seq_len=4, pad=BYTE_PAD, dtype="uint16")
    assert samples["tokens"].tolist() == [[5, 6, 7, 8], [1, 2, 257, 257], [257] * 4]
    assert samples["length"].tolist() == [4, 2, 0] and samples["length"].dtype == np.int32
    assert samples["label"].dtype == np.int64
    buffer = ShardBuffer(tmp_path, "train", lm_columns(3, "uint16"), per_shard=4)
    for _ in range(3):
        buffer.add({"tokens": np.zeros((3, 4), np.uint16), "id": ["x", "y", "z"]})
    assert [e["num_samples"] for e in buffer.finish()] == [4, 4, 1]


def test_lm_shards_hold_the_whole_stream_in_full_windows(tmp_path):
    spec = corpus_spec(seq_len=15, docs_per_chunk=7)
    corpus = words_corpus(40)
    raw = ingest(spec, tmp_path, corpus)
    assert raw.report.passed, raw.report.failures
    assert pq.ParquetFile(raw.path).num_row_groups == 6  # 7 documents a chunk: the stream spans row groups
    assert pq.read_schema(raw.path).names == ["id", "text_sha256", "chars", "text"]
    copy = pd.read_parquet(raw.path)  # each text's sha256, the 32 bytes a part's key is made of
    assert [bytes(d) for d in copy["text_sha256"]] == [hashlib.sha256(t.encode()).digest() for t in copy["text"]]
    manifest = TEXT.shard(spec, raw.path, tmp_path / "shards")
    assert [c["name"] for c in manifest["columns"]] == ["tokens", "id"]
    assert manifest["columns"][0] == {"name": "tokens", "kind": "ndarray", "role": "input", "dtype": "uint16",
                                           "shape": [16]}
    ids = pd.read_parquet(raw.path)["id"]
    split_of = assign_splits(ids, 0, (0.8, 0.1, 0.1))
    for code, split in enumerate(SPLITS):
        body = manifest["splits"][split]
        members = [corpus[i] for i in ids[split_of == code]]
        stream = sum(len(t.encode()) for t in members) + len(members) - 1
        assert body["num_documents"] == len(members) and body["stream_tokens"] == stream
        assert body["num_tokens"] + body["dropped_tokens"] == stream and body["dropped_tokens"] < 16
        tokens, window_ids = read_split_tokens(manifest, tmp_path / "shards", split)
        assert tokens.shape == (body["num_samples"], 16) and not (tokens == BYTE_PAD).any()
        expected = (b"\0".join(t.encode() for t in members))  # \0 stands for the eos between documents
        got = bytes(0 if t == BYTE_EOS else int(t) for t in tokens.ravel())
        assert got == expected[:len(got)] and set(window_ids) <= set(ids)
    assert len(manifest["splits"]["train"]["shards"]) > 1  # samples_per_shard=8 cuts several files
    assert TEXT.check_shards(spec, manifest, tmp_path / "shards").passed


def test_bpe_is_fitted_on_the_training_split_only(tmp_path):
    rng = random.Random(1)
    markers = ["".join(rng.choice(string.ascii_lowercase) for _ in range(9)) for _ in range(50)]
    corpus = {f"toy/doc_{i:03d}.txt": " ".join([m] * 20) for i, m in enumerate(markers)}
    spec = corpus_spec(tokenizer="bpe", vocab_size=2000)
    raw = ingest(spec, tmp_path, corpus)
    manifest = TEXT.shard(spec, raw.path, tmp_path / "shards")
    vocab = json.loads((tmp_path / "shards/tokenizer.json").read_text())["model"]["vocab"]
    assert manifest["files"] == ["tokenizer.json"] and manifest["tokenizer"]["path"] == "tokenizer.json"
    ids = pd.Series(sorted(corpus))
    in_train = dict(zip(ids, assign_splits(ids, 0, (0.8, 0.1, 0.1)) == 0))
    seen = {rel: ("Ġ" + markers[i]) in vocab for i, rel in enumerate(sorted(corpus))}
    assert sum(in_train.values()) < len(corpus)
    assert seen == in_train  # every training marker became a token, no other one did
    assert (manifest["tokenizer"]["eos_id"], manifest["tokenizer"]["pad_id"]) == (0, 1)
    tokenizer = BpeTokenizer.load(tmp_path / "shards/tokenizer.json")
    text = "naïve 日本 text that mentions <|endoftext|> and " + markers[0]
    (ids,) = tokenizer.encode_batch([text])
    assert tokenizer.decode(ids) == text and 0 not in ids.tolist()  # bytes round-trip; eos only from the packer
    assert TEXT.check_shards(spec, manifest, tmp_path / "shards").passed


def test_the_same_corpus_gives_the_same_bytes(tmp_path):
    spec = corpus_spec(tokenizer="bpe", vocab_size=400)
    corpus = words_corpus(30, seed=3)
    outputs = []
    for attempt in ("one", "two"):
        raw = ingest(spec, tmp_path / attempt, corpus)
        manifest = TEXT.shard(spec, raw.path, tmp_path / attempt / "shards")
        files = {p.relative_to(tmp_path / attempt): p.read_bytes() for p in sorted((tmp_path / attempt).rglob("*"))
                 if p.is_file() and "sources" not in p.parts}
        outputs.append((json.dumps(manifest, sort_keys=True), files))
    assert outputs[0] == outputs[1]
    assert Path("documents.parquet") in outputs[0][1] and Path("shards/tokenizer.json") in outputs[0][1]


def test_a_changed_user_function_changes_the_code_hash(tmp_path, monkeypatch):
    module = tmp_path / "textprep_under_test.py"
    module.write_text("def clean(text):\n    return text.lower()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = corpus_spec(function="textprep_under_test:clean")
    raw = ingest(spec, tmp_path, {"toy/a.txt": "Hello World " * 10, "toy/b.txt": "ABC " * 30,
                                  **words_corpus(20)})
    plain = TEXT.shard(corpus_spec(), raw.path, tmp_path / "plain")
    lowered = TEXT.shard(spec, raw.path, tmp_path / "lowered")
    module.write_text("def clean(text):\n    return text.upper()  # shouting now\n")
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "textprep_under_test")
    raised = TEXT.shard(spec, raw.path, tmp_path / "raised")
    hashes = {m["preprocessing"]["code_sha256"] for m in (plain, lowered, raised)}
    assert len(hashes) == 3  # same parameters and function name for the last two: only the code differs
    assert lowered["preprocessing"]["function"] == "textprep_under_test:clean"
    assert lowered["splits"]["train"]["shards"] != raised["splits"]["train"]["shards"]
    tokens, _ = read_split_tokens(raised, tmp_path / "raised", "train")
    assert not any(ord("a") <= t <= ord("z") for t in tokens.ravel())  # applied before tokenizing


def test_shard_checks_catch_a_changed_file_and_out_of_vocabulary_ids(tmp_path):
    spec = corpus_spec()
    raw = ingest(spec, tmp_path, words_corpus(30))
    out = tmp_path / "shards"
    manifest = TEXT.shard(spec, raw.path, out)
    entry = manifest["splits"]["validation"]["shards"][0]
    data = bytearray((out / entry["path"]).read_bytes())
    first = entry["columns"]["tokens"]["offset"]
    data[first:first + 2] = (60_000).to_bytes(2, "little")  # the first token of the first window
    (out / entry["path"]).write_bytes(bytes(data))
    report = TEXT.check_shards(spec, manifest, out)
    assert not report.passed
    problems = "\n".join(report.failures)
    assert f"shard {entry['path']}: sha256" in problems
    assert f"shard {entry['path']}: token ids from" in problems and "outside the vocabulary 0..257" in problems
    assert "shards: expect_column_values_to_be_between(max_token)" in problems


# --- the dataset pipeline's job --------------------------------------------------------------------

def test_pydoc_topics_become_a_published_bpe_language_modelling_dataset(platform):
    folder = write_pydoc_source(platform.sources)
    topics = pydoc_topics()
    assert len(list(folder.glob("*.txt"))) == len(topics) and data_kind(pydoc_corpus) is TEXT

    result = platform.run(pydoc_corpus)

    assert result.success, failure_messages(result)
    store = platform.store()
    assert "pydoc-d1" in store.list_tags() and list(dataset_tags(store, "pydoc")) == [1]
    manifest = json.loads(store.get_object("main", "datasets/pydoc/shards/manifest.json"))
    assert manifest["tokenizer"]["vocab_size"] == 2048 and manifest["token_dtype"] == "uint16"
    assert manifest["preprocessing"]["tokenizer"] == "bpe" and manifest["files"] == ["tokenizer.json"]
    assert sum(s["num_documents"] for s in manifest["splits"].values()) == len(topics)
    tokenizer = BpeTokenizer.load(store.download("main", "datasets/pydoc/shards/tokenizer.json",
                                                 platform.root / "tokenizer.json"))
    entry = manifest["splits"]["train"]["shards"][0]
    shard_file = store.download("main", "datasets/pydoc/shards/" + entry["path"], platform.root / "shard.bin")
    window = ShardColumns(shard_file, entry, columns_from_manifest(manifest)).arrays["tokens"][10]
    assert window.shape == (129,)
    pieces = np.split(window, np.flatnonzero(window == tokenizer.eos_id))
    longest = max(pieces, key=len)
    text = tokenizer.decode(longest[1:] if longest[0] == tokenizer.eos_id else longest).strip("\ufffd")
    assert len(text) > 40 and any(text in body for body in topics.values())
    report = json.loads(store.get_object("main", "datasets/pydoc/validation/shards.json"))
    assert report["passed"] and report["evaluated"] > 0


def test_a_jsonl_corpus_becomes_a_classification_dataset(platform):
    rng = random.Random(7)
    classes = ("negative", "neutral", "positive")
    records = [{"text": f"review {i}: " + "good " * rng.randint(1, 30), "label": classes[i % 3], "stars": i % 5}
               for i in range(150)]
    lines = [json.dumps(r) for r in records]
    write_files(platform.sources, {"reviews/part-a.jsonl": "\n".join(lines[:70]) + "\n",
                                   "reviews/part-b.jsonl": "\n".join(lines[70:]) + "\n\n"})
    spec = corpus_spec("reviews", task="classification", labels=classes, seq_len=64, samples_per_shard=32)

    result = platform.run(spec)

    assert result.success, failure_messages(result)
    store = platform.store()
    assert "reviews-d1" in store.list_tags()
    manifest = json.loads(store.get_object("main", "datasets/reviews/shards/manifest.json"))
    assert [(c["name"], c.get("dtype")) for c in manifest["columns"]] == [
        ("tokens", "uint16"), ("length", "int32"), ("label", "int64"), ("id", None)]
    assert manifest["class_names"] == list(classes) and manifest["num_classes"] == 3 and manifest["files"] == []
    assert sum(s["num_samples"] for s in manifest["splits"].values()) == 150
    assert manifest["splits"]["train"]["truncated_documents"] > 0
    by_id = {f"reviews/part-{'a' if i < 70 else 'b'}.jsonl:{i + 1 if i < 70 else i - 69}": r
             for i, r in enumerate(records)}
    columns = columns_from_manifest(manifest)
    for entry in manifest["splits"]["test"]["shards"]:
        shard = ShardColumns(store.download("main", "datasets/reviews/shards/" + entry["path"],
                                            platform.root / entry["path"]), entry, columns)
        for i in range(shard.num_samples):
            record = by_id[shard.value("id", i).decode()]
            length = int(shard.arrays["length"][i])
            assert bytes(shard.arrays["tokens"][i][:length].astype(np.uint8)) == record["text"].encode()[:64]
            assert classes[int(shard.arrays["label"][i])] == record["label"]
    raw_copy = pd.read_parquet(store.download("main", "datasets/reviews/raw/documents.parquet",
                                              platform.root / "documents.parquet"))
    assert list(raw_copy.columns) == ["id", "text_sha256", "label", "chars", "text"] and raw_copy["id"].tolist() == list(by_id)
    raw_report = json.loads(store.get_object("main", "datasets/reviews/validation/raw_dataset.json"))
    shares = next(r for r in raw_report["results"] if r["expectation"] == "report_class_shares")["observed"]
    assert shares == {c: pytest.approx(1 / 3, abs=1e-5) for c in classes}


# --- bad input: refused, named, main untouched -------------------------------------------------------

GOOD_TEXT = "A document long enough for every case here. " * 3
GOOD_LINE = json.dumps({"text": GOOD_TEXT, "label": "ham"})


def _outside_link(folder: Path) -> None:
    target = folder.parent.parent / "elsewhere.txt"
    target.write_text(GOOD_TEXT)
    (folder / "link.txt").symlink_to(target)


# (case, task, files under bad/, fragments of the failure message, source options)
BAD_INPUTS = [
    ("not_utf8_txt", "language_modeling", {"bad/latin1.txt": "café au lait".encode("latin-1")},
     ["bad/latin1.txt: not UTF-8: byte 3 of the file (0xe9)"], {}),
    ("not_utf8_jsonl", "language_modeling",
     {"bad/a.jsonl": f'{{"text": "{GOOD_TEXT}"}}\n'.encode() + b'{"text": "caf\xe9"}\n'},
     ["bad/a.jsonl line 2: not UTF-8: byte", "(0xe9)"], {}),
    ("not_json", "language_modeling", {"bad/a.jsonl": f'{{"text": "{GOOD_TEXT}"}}\n{{"text": "cut\n'},
     ["bad/a.jsonl line 2: not JSON"], {}),
    ("not_an_object", "language_modeling", {"bad/a.jsonl": '["a list", "of strings"]\n'},
     ["bad/a.jsonl line 1: a JSON array, not an object"], {}),
    ("missing_text_field", "language_modeling", {"bad/a.jsonl": json.dumps({"body": GOOD_TEXT}) + "\n"},
     ["bad/a.jsonl line 1: no text field 'text'"], {}),
    ("text_not_a_string", "language_modeling", {"bad/a.jsonl": json.dumps({"text": 42}) + "\n"},
     ["bad/a.jsonl line 1: text field 'text' is a JSON number, not a string"], {}),
    ("missing_label", "classification",
     {"bad/a.jsonl": "\n".join([GOOD_LINE, GOOD_LINE, json.dumps({"text": GOOD_TEXT})]) + "\n"},
     ["bad/a.jsonl line 3: no label in field 'label'"], {}),
    ("unknown_label", "classification",
     {"bad/a.jsonl": "\n".join([GOOD_LINE, json.dumps({"text": GOOD_TEXT, "label": "eggs"})]) + "\n"},
     ["bad/a.jsonl line 2: label 'eggs' is not one of the declared classes ['ham', 'spam']"], {}),
    ("too_short", "language_modeling", {"bad/good.txt": GOOD_TEXT, "bad/short.txt": "tiny"},
     ["bad/short.txt: 4 characters, fewer than min_chars=20"], {"min_chars": 20}),
    ("too_long", "language_modeling", {"bad/long.txt": "x" * 1500},
     ["bad/long.txt: 1,500 characters, more than max_chars=1,000"], {"max_chars": 1000}),
    ("only_empty_files", "language_modeling", {"bad/a.txt": b"", "bad/b.jsonl": b""},
     ["bad/a.txt: the file is empty (0 bytes)", "the corpus holds no documents"], {}),
    ("no_documents", "language_modeling", {"bad/a.jsonl": "\n  \n\n"}, ["the corpus holds no documents"], {}),
    ("unknown_extension", "language_modeling", {"bad/good.txt": GOOD_TEXT, "bad/notes.md": GOOD_TEXT},
     ["bad/notes.md: the extension '.md' is neither .jsonl nor .txt"], {}),
    ("link_outside_the_root", "language_modeling", {"bad/good.txt": GOOD_TEXT},
     ["bad/link.txt: a symbolic link to", "outside the sources root"], {"link": _outside_link}),
]


@pytest.fixture(scope="module")
def shared_platform(tmp_path_factory):
    """One store for the catalogue (every case must leave main as it found it anyway), and an
    in-memory Dagster instance: a new SQLite event log per run took longer than the run itself."""
    p = Platform(tmp_path_factory.mktemp("text-catalogue"))
    p.instance.dispose()
    p.instance = dg.DagsterInstance.ephemeral()
    with p.instance:
        yield p


@pytest.mark.parametrize("case, task, files, fragments, options", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_refused_naming_the_file_and_leaves_main_alone(shared_platform, case, task, files, fragments,
                                                                    options):
    platform = shared_platform
    folder = platform.sources / "bad"
    if folder.exists():
        for old in folder.iterdir():
            old.unlink()
    write_files(platform.sources, files)
    options = dict(options)
    if "link" in options:
        options.pop("link")(folder)
    spec = corpus_spec("bad", task=task, labels=("ham", "spam") if task == "classification" else None, **options)
    store = platform.store()
    store.ensure_repository()
    main_before = store.resolve_ref("main")

    result = platform.run(spec)

    assert not result.success
    messages = failure_messages(result)
    assert all(f in messages for f in fragments), messages
    assert store.resolve_ref("main") == main_before and not store.list_objects("main", prefix="datasets/")
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "raw_expectations" and not check.passed
    branch = f"run-{result.run_id}"
    report = json.loads(store.get_object(branch, "datasets/bad/validation/raw_dataset.json"))
    assert report["passed"] is False and all(any(f in failure for failure in report["failures"])
                                             for f in fragments)
    assert not store.list_objects(branch, prefix="datasets/bad/raw/documents.parquet")  # not committed


# --- absolute paths: read as they are (docs/pipelines.md#where-sources-live) ------------------------

def test_a_corpus_of_absolute_globs_is_read_as_it_is(platform, tmp_path):
    elsewhere = tmp_path / "elsewhere" / "books"  # outside the sources root and the store
    write_files(elsewhere, {k.removeprefix("toy/"): v for k, v in words_corpus(40).items()})
    spec = dataset_pipeline("books", source=TextCorpus(paths=(f"{elsewhere}/*.txt",)), task="language_modeling",
                            split={"samples_per_shard": 8}, preprocessing=TextPreprocessing(seq_len=16))

    result = platform.run(spec)

    assert result.success, failure_messages(result)
    store = platform.store()
    assert "books-d1" in store.list_tags()
    raw_copy = pd.read_parquet(store.download("main", "datasets/books/raw/documents.parquet",
                                              platform.root / "documents.parquet"))
    # documents are named under the folder the glob names, so the same files elsewhere key alike
    assert sorted(raw_copy["id"]) == [f"doc_{i:03d}.txt" for i in range(40)]
    logs = [e.user_message for e in platform.instance.all_logs(result.run_id)]
    assert "books: reading 40 file(s) of its absolute paths, as they are" in logs


def test_an_absolute_glob_that_matches_nothing_fails_at_once_naming_it(platform, tmp_path):
    missing = tmp_path / "nowhere"
    spec = dataset_pipeline("books", source=TextCorpus(paths=(f"{missing}/*.txt",)), task="language_modeling",
                            split={"samples_per_shard": 8}, preprocessing=TextPreprocessing(seq_len=16))

    result = platform.run(spec)

    assert not result.success
    assert failure_messages(result).strip().endswith(
        f"Failure: pipeline 'books': no files match ['{missing}/*.txt']; fix the corpus' absolute paths")
    # bad input: no retry of the step's RetryPolicy (it cannot help), one failure
    assert [e.event_type_value for e in result.all_events if e.is_step_failure or e.is_step_up_for_retry] == [
        "STEP_FAILURE"]


def test_a_corpus_mixing_absolute_and_relative_paths_is_refused(tmp_path):
    from core.spec_fields import PipelineDefinitionError

    with pytest.raises(PipelineDefinitionError, match="mixes absolute paths .* make them all absolute or all "
                                                      "relative"):
        dataset_pipeline("books", source=TextCorpus(paths=("books/*.txt", f"{tmp_path}/*.txt")),
                         task="language_modeling")
