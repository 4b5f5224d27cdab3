"""Dataset versions: ``<dataset>-d<N>`` tags on published shards commits (one version, one commit),
their reuse, listing and resolution.

Real pipelines publishing versions: tests/teams (a model's registration, d1 then d2 on changed
data; a dataset pipeline run twice on the same data keeping d1), tests/pipeline/test_dataset_reuse.py
(reuse without ingesting, after a failed gate too) and tests/cli (``datasets``)."""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from core.datasets import (DataCheck, UnknownDatasetVersionError, dataset_tag, dataset_tags, list_dataset_versions,
                           parse_dataset_tag, plan_dataset_version, published_datasets, resolve_dataset_version,
                           reusable_version, tag_published_dataset, version_disagreements)
from core.versions import register_version
from resources.store.base import MAIN, StoreError
from resources.store.local import LocalVersionedStore

SPLITS = ("train", "validation", "test")


def _store(tmp_path, repository="repo") -> LocalVersionedStore:
    s = LocalVersionedStore(tmp_path, repository)
    s.ensure_repository()
    return s


def _publish_shards(store, run: str, dataset: str = "digits", samples=(8, 2, 2), source_commit: str = "raw-1",
                    shards_passed: bool = True, data_key: dict | None = None) -> str:
    """Commit shards, a manifest and validation reports on ``run-<run>``, merge into main; the shards commit."""
    branch = f"run-{run}"
    store.create_branch(branch, MAIN)
    prefix = f"datasets/{dataset}/shards/"
    splits = {}
    for split, n in zip(SPLITS, samples):
        data = f"{split}:{n}".encode() * n  # the bytes follow the sample count, so other counts are other data
        store.put_object(branch, prefix + f"{split}/00000.bin", data)
        splits[split] = {"num_samples": n, "shards": [{"path": f"{split}/00000.bin", "num_samples": n,
                                                      "sha256": hashlib.sha256(data).hexdigest()}]}
    manifest = {"format": "model-factory.shards/v1", "splits": splits, "source_commit": source_commit,
                **({"data_key": data_key} if data_key else {})}
    store.put_object(branch, prefix + "manifest.json", json.dumps(manifest, sort_keys=True).encode())
    for asset, passed, evaluated in (("raw_dataset", True, 9), ("shards", shards_passed, 8)):
        report = {"asset": f"{dataset}/{asset}", "passed": passed, "evaluated": evaluated,
                  "failed": 0 if passed else 1, "failures": [] if passed else ["samples: broken"]}
        store.put_object(branch, f"datasets/{dataset}/validation/{asset}.json", json.dumps(report).encode())
    commit = store.commit(branch, f"Shard {dataset}", {})
    store.merge(branch, MAIN, f"Publish {dataset} from {run}", {"run": run})
    return commit.id


def _register(store, model: str, shards_commit: str, dataset: str = "digits", dataset_version: str | None = None,
              run: str | None = None) -> int:
    """Publish a model version whose lineage record says what it trained on (without tagging the dataset)."""
    branch = f"reg-{run or model}-{len(store.list_tags())}"
    store.create_branch(branch, MAIN)
    data = {"dataset": dataset, "shards_commit": shards_commit, "raw_commit": shards_commit,
            **({"dataset_version": dataset_version} if dataset_version else {})}
    return register_version(store, branch, model, lambda v: {"model": model, "version": v, "data": data},
                            {"model.safetensors": b"weights"}, {}).version


# --- names -------------------------------------------------------------------------------------------
def test_dataset_tags_are_told_apart_from_model_tags_and_similar_names():
    assert dataset_tag("digits", 3) == "digits-d3"
    assert parse_dataset_tag("digits-d3") == ("digits", 3)
    assert parse_dataset_tag("digits_cnn-d1") == ("digits_cnn", 1)
    for not_a_dataset_tag in ("digits-v1", "digits_cnn-v2", "digits-d0", "digits-d01", "digits-d", "d1", "x-d1-v1"):
        assert parse_dataset_tag(not_a_dataset_tag) is None, not_a_dataset_tag
    for bad in (("Digits", 1), ("digits", 0), ("my-data", 1)):
        with pytest.raises(ValueError, match="versions count from 1"):
            dataset_tag(*bad)


def test_listing_tags_of_one_dataset_ignores_models_and_datasets_with_a_longer_name(tmp_path):
    s = _store(tmp_path)
    s.create_branch("run-a", MAIN)
    s.put_object("run-a", "f", b"1")
    commit = s.commit("run-a", "c", {}).id
    for tag in ("digits-v1", "digits_cnn-v1", "digits_cnn-d1", "digits-d2", "digits-d1", "wine-d1"):
        s.create_tag(tag, commit)
    assert dataset_tags(s, "digits") == {1: commit, 2: commit}
    assert dataset_tags(s, "digits_cnn") == {1: commit}
    assert published_datasets(s) == ["digits", "digits_cnn", "wine"]


# --- tagging -------------------------------------------------------------------------------------------
def test_new_data_gets_the_next_number_and_tagging_again_is_idempotent(tmp_path):
    s = _store(tmp_path)
    first = _publish_shards(s, "a", samples=(8, 2, 2))
    assert tag_published_dataset(s, "digits", first) == "digits-d1"
    second = _publish_shards(s, "b", samples=(9, 3, 2), source_commit="raw-2")
    assert tag_published_dataset(s, "digits", second) == "digits-d2"

    assert tag_published_dataset(s, "digits", first) == "digits-d1"  # a retry, or another model on that data
    assert tag_published_dataset(s, "digits", second) == "digits-d2"
    assert tag_published_dataset(s, "digits", second, planned="digits-d2") == "digits-d2"
    assert dataset_tags(s, "digits") == {1: first, 2: second}


def test_a_version_names_one_commit_so_equal_shards_at_another_commit_are_a_new_version(tmp_path):
    """A run that did not reuse the version (its data key differed: other code, say) made a new
    commit; even with the same shard bytes it is a new version, never a second commit of d1."""
    s = _store(tmp_path)
    first = _publish_shards(s, "a", source_commit="raw-1")
    assert tag_published_dataset(s, "digits", first) == "digits-d1"
    again = _publish_shards(s, "b", source_commit="raw-2")
    assert again != first

    assert plan_dataset_version(s, "digits", again) == "digits-d2"
    assert tag_published_dataset(s, "digits", again) == "digits-d2"
    assert plan_dataset_version(s, "digits", first) == "digits-d1"  # a retry on d1's commit keeps d1
    assert dataset_tags(s, "digits") == {1: first, 2: again}


def test_data_returning_to_an_older_version_is_a_new_version(tmp_path):
    """Only the newest version is compared: "newest" must always name the data main now holds."""
    s = _store(tmp_path)
    assert tag_published_dataset(s, "digits", _publish_shards(s, "a", samples=(8, 2, 2))) == "digits-d1"
    assert tag_published_dataset(s, "digits", _publish_shards(s, "b", samples=(9, 2, 2))) == "digits-d2"
    back = _publish_shards(s, "c", samples=(8, 2, 2), source_commit="raw-3")
    assert tag_published_dataset(s, "digits", back) == "digits-d3"


def test_datasets_are_numbered_apart(tmp_path):
    s = _store(tmp_path)
    digits = _publish_shards(s, "a", dataset="digits")
    cnn_named = _publish_shards(s, "b", dataset="digits_cnn")
    assert tag_published_dataset(s, "digits", digits) == "digits-d1"
    assert tag_published_dataset(s, "digits_cnn", cnn_named) == "digits_cnn-d1"
    assert tag_published_dataset(s, "digits", digits) == "digits-d1"


class _MeetingStore(LocalVersionedStore):
    """Holds each tagger's first create_tag until the other has also planned its tag: a worst-case race."""

    def __init__(self, root, repository, meeting: threading.Barrier):
        super().__init__(root, repository)
        self.meeting = meeting
        self.met = False
        self.tries: list[str] = []

    def create_tag(self, tag: str, ref: str) -> str:
        self.tries.append(tag)
        if not self.met:
            self.met = True
            self.meeting.wait(timeout=30)
        return super().create_tag(tag, ref)


def _tag_at_once(tmp_path, commits: list[str]) -> tuple[list[str], list[str]]:
    """(each tagger's tag, every create_tag tried)."""
    meeting = threading.Barrier(len(commits))
    stores = [_MeetingStore(tmp_path, "repo", meeting) for _ in commits]  # as two processes would open it
    with ThreadPoolExecutor(len(commits)) as pool:
        got = list(pool.map(lambda pair: tag_published_dataset(pair[0], "digits", pair[1]), zip(stores, commits)))
    return got, sorted(t for s in stores for t in s.tries)


def test_two_taggers_of_different_data_at_once_get_different_numbers(tmp_path):
    s = _store(tmp_path)
    a = _publish_shards(s, "a", samples=(8, 2, 2))
    b = _publish_shards(s, "b", samples=(9, 2, 2))
    assert plan_dataset_version(s, "digits", a) == plan_dataset_version(s, "digits", b) == "digits-d1"

    got, tries = _tag_at_once(tmp_path, [a, b])

    assert sorted(got) == ["digits-d1", "digits-d2"]
    assert tries == ["digits-d1", "digits-d1", "digits-d2"]  # the loser was refused d1, re-read, took d2
    assert dataset_tags(s, "digits") == {1: a if got[0] == "digits-d1" else b, 2: b if got[0] == "digits-d1" else a}


def test_two_taggers_of_the_same_commit_at_once_share_one_tag(tmp_path):
    s = _store(tmp_path)
    commit = _publish_shards(s, "a")
    assert _tag_at_once(tmp_path, [commit, commit]) == (["digits-d1", "digits-d1"], ["digits-d1", "digits-d1"])
    assert dataset_tags(s, "digits") == {1: commit}


def test_a_store_failure_that_is_not_a_taken_tag_is_raised(tmp_path):
    s = _store(tmp_path)
    commit = _publish_shards(s, "a")
    s.create_branch("digits-d1", MAIN)  # the name lakeFS would refuse for a tag
    with pytest.raises(StoreError, match="a branch has that name"):
        tag_published_dataset(s, "digits", commit)


def test_a_planned_tag_held_by_other_data_is_an_inconsistency_not_a_rename(tmp_path):
    s = _store(tmp_path)
    other = _publish_shards(s, "a", samples=(8, 2, 2))
    s.create_tag("digits-d1", other)
    mine = _publish_shards(s, "b", samples=(9, 2, 2))
    with pytest.raises(StoreError, match="a lineage record names 'digits-d1'"):
        tag_published_dataset(s, "digits", mine, planned="digits-d1")
    assert dataset_tags(s, "digits") == {1: other}


def test_a_tag_a_published_record_claims_is_created_before_numbering_new_data(tmp_path):
    """The store failed after a registration merged (its record says digits-d1) and before it tagged."""
    s = _store(tmp_path)
    first = _publish_shards(s, "a", samples=(8, 2, 2))
    _register(s, "digits", first, dataset_version="digits-d1")
    assert dataset_tags(s, "digits") == {}
    second = _publish_shards(s, "b", samples=(9, 2, 2))

    assert tag_published_dataset(s, "digits", second) == "digits-d2"
    assert dataset_tags(s, "digits") == {1: first, 2: second}


# --- reusing --------------------------------------------------------------------------------------------
def _key(sources="s1", parameters="p1", code="c1") -> dict:
    return {"sha256": f"{sources}-{parameters}-{code}", "sources": sources, "parameters": parameters, "code": code}


def test_the_newest_version_with_the_same_data_key_is_reused_and_other_keys_say_what_changed(tmp_path):
    s = _store(tmp_path)
    assert reusable_version(s, "digits", _key()).changed == ("no published version",)
    first = _publish_shards(s, "a", data_key=_key())
    tag_published_dataset(s, "digits", first)

    same = reusable_version(s, "digits", _key())
    assert (same.tag, same.commit_id, same.manifest["source_commit"]) == ("digits-d1", first, "raw-1")
    other = reusable_version(s, "digits", _key(code="c2"))
    assert (other.tag, other.changed, other.newest) == (None, ("code",), "digits-d1")
    assert reusable_version(s, "digits", _key(sources="s2", parameters="p2")).changed == ("sources", "parameters")

    # Only the newest version counts: data back at d1's content is new data (main holds d2's).
    second = _publish_shards(s, "b", samples=(9, 2, 2), data_key=_key(sources="s2"))
    tag_published_dataset(s, "digits", second)
    assert reusable_version(s, "digits", _key()).tag is None
    assert reusable_version(s, "digits", _key(sources="s2")).commit_id == second


def test_a_version_without_a_data_key_or_with_a_failed_report_is_not_reused(tmp_path):
    s = _store(tmp_path)
    tag_published_dataset(s, "digits", _publish_shards(s, "a"))  # shards made before data keys
    assert reusable_version(s, "digits", _key()).changed == ("sources", "parameters", "code")
    tag_published_dataset(s, "digits", _publish_shards(s, "b", samples=(9, 2, 2), shards_passed=False,
                                                       data_key=_key()))
    assert reusable_version(s, "digits", _key()).changed == ("checks",)


def test_records_naming_a_version_beside_another_commit_are_listed(tmp_path):
    """What stores from before exact versions may hold: d1 named beside a later, equal commit."""
    s = _store(tmp_path)
    first = _publish_shards(s, "a")
    tag_published_dataset(s, "digits", first)
    later = _publish_shards(s, "b", source_commit="raw-2")
    _register(s, "digits", later, dataset_version="digits-d1")
    assert version_disagreements(s, "digits") == [
        f"digits v1 names digits-d1 (commit {first[:12]}) but trained on commit {later[:12]}"]


# --- listing ---------------------------------------------------------------------------------------------
def test_listing_shows_counts_checks_and_the_model_versions_trained_on_each(tmp_path):
    s = _store(tmp_path)
    first = _publish_shards(s, "a", samples=(8, 2, 2))
    _register(s, "digits", first)  # a record from before dataset versions: matched by its shards commit
    assert tag_published_dataset(s, "digits", first) == "digits-d1"
    _register(s, "digits_cnn", first, dataset_version="digits-d1")
    _register(s, "digits", first, dataset_version=tag_published_dataset(s, "digits", first))  # retrained, reused
    second = _publish_shards(s, "c", samples=(9, 3, 2), source_commit="raw-3", shards_passed=False)
    _register(s, "digits", second, dataset_version=tag_published_dataset(s, "digits", second))
    wine = _publish_shards(s, "d", dataset="wine")
    _register(s, "wine", wine, dataset="wine", dataset_version=tag_published_dataset(s, "wine", wine))

    v1, v2 = list_dataset_versions(s, "digits")

    assert (v1.tag, v1.number, v1.commit_id, v1.dataset) == ("digits-d1", 1, first, "digits")
    assert v1.num_samples == {"train": 8, "validation": 2, "test": 2}
    assert v1.checks == {"raw_dataset": DataCheck(passed=True, expectations=9, failed=0),
                         "shards": DataCheck(passed=True, expectations=8, failed=0)}
    assert v1.models == ("digits v1", "digits v2", "digits_cnn v1")
    assert v1.committed_at.endswith("+00:00")
    assert (v2.tag, v2.commit_id, v2.num_samples) == ("digits-d2", second, {"train": 9, "validation": 3, "test": 2})
    assert v2.checks["shards"] == DataCheck(passed=False, expectations=8, failed=1)
    assert v2.models == ("digits v3",)
    assert version_disagreements(s, "digits") == []
    assert json.loads(json.dumps(v2.to_dict()))["checks"]["shards"]["passed"] is False
    assert [v.models for v in list_dataset_versions(s, "wine")] == [("wine v1",)]
    assert list_dataset_versions(s, "digits_cnn") == []


# --- resolving -------------------------------------------------------------------------------------------
@pytest.fixture
def two_versions(tmp_path):
    s = _store(tmp_path)
    commits = [_publish_shards(s, run, samples=(8 + i, 2, 2)) for i, run in enumerate("ab")]
    for c in commits:
        tag_published_dataset(s, "digits", c)
    return s, commits


def test_resolving_the_newest_a_tag_or_a_number(two_versions):
    s, (first, second) = two_versions
    assert resolve_dataset_version(s, "digits", None) == ("digits-d2", second)
    for spelling in ("digits-d1", "d1", "1", 1, " 1 "):
        assert resolve_dataset_version(s, "digits", spelling) == ("digits-d1", first), spelling


@pytest.mark.parametrize("version, message", [
    ("digits-d3", r"dataset 'digits' has no version 'digits-d3'; published versions: digits-d1, digits-d2\. Give"),
    (7, r"has no version 7; published versions: digits-d1, digits-d2"),
    ("digits_cnn-d1", r"'digits_cnn-d1' is not a version of dataset 'digits'; use a tag such as 'digits-d2'"),
    ("digits-v1", r"'digits-v1' is not a version of dataset 'digits'"),
    ("latest", r"'latest' is not a version of dataset 'digits'.*published versions: digits-d1, digits-d2"),
])
def test_resolving_a_version_that_does_not_exist_says_what_does(two_versions, version, message):
    s, _ = two_versions
    with pytest.raises(UnknownDatasetVersionError, match=message):
        resolve_dataset_version(s, "digits", version)


def test_resolving_a_dataset_without_versions_names_those_that_have_some_and_the_fix(two_versions):
    s, _ = two_versions
    with pytest.raises(LookupError, match=r"dataset 'wine' has no published versions \(datasets with versions: "
                                          r"digits\); .*run the wine_training job"):
        resolve_dataset_version(s, "wine", None)


def test_a_store_without_a_repository_has_no_dataset_versions(tmp_path):
    s = LocalVersionedStore(tmp_path, "never-created")
    with pytest.raises(UnknownDatasetVersionError, match="holds no published datasets yet"):
        resolve_dataset_version(s, "digits", None)
    with pytest.raises(UnknownDatasetVersionError, match="holds no published datasets yet"):
        list_dataset_versions(s, "digits")
