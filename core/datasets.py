"""Dataset versions users can name: version N of dataset D is the tag ``D-dN`` on the store commit
that holds the shards (``datasets/D/shards/``) a model trained on when that model was published.

One version is one commit. A tag means "published": it is created only after the shards reached
``main`` (``register_version`` merged the run branch, or a dataset pipeline published its shards).
A run whose raw content and preprocessing equal the newest version's (the same ``data_key`` in
its manifest: assets/data_key.py) does not ingest or shard again: it reuses that version's
commit (``reusable_version``), and its lineage names the version and that commit. Anything else
is a new commit and so a new version, ``D-d<N+1>``, even when its shards happen to hold the same
bytes: a version never names two commits.

Lineage records name the version they trained on (``record["data"]["dataset_version"]``) beside
its commit (``shards_commit``). The name is planned before the record is committed and the tag is
created after the merge, so a record published on ``main`` is the claim a tag must honour:
planning first creates any tag a published record claims but the store lacks (a failure between
the merge and the tag), exactly as ``core.versions.repair_untagged_versions`` does for model
versions. ``version_disagreements`` lists records whose version's tag points elsewhere (records
made before versions were exact).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from resources.store.base import MAIN, RefNotFoundError, StoreError, VersionedStore

# Dataset names follow pipeline names (core.spec): lowercase letters, digits and '_', so the dash
# before "d<N>" (and before a model tag's "v<N>") cannot be part of a name.
_DATASET_TAG = re.compile(r"^(?P<dataset>[a-z][a-z0-9_]*)-d(?P<number>[1-9][0-9]*)$")
_LINEAGE_ON_MAIN = re.compile(r"^models/[^/]+/versions/v[0-9]+/lineage\.json$")
CHECKED_ASSETS = ("raw_dataset", "shards")  # the validation reports committed beside the data
DATA_KEY = "data_key"  # the manifest field naming what the shards were made from (assets/data_key.py)
DATA_KEY_PARTS = ("sources", "parameters", "code")


class UnknownDatasetVersionError(LookupError):
    """A dataset, or a version of it, that the store has not published."""


@dataclass(frozen=True)
class DataCheck:
    """One validation report committed beside the data (raw_dataset or shards)."""

    passed: bool
    expectations: int  # how many expectations the suite evaluated
    failed: int


@dataclass(frozen=True)
class DatasetVersion:
    dataset: str
    tag: str  # "<dataset>-d<N>"
    number: int
    commit_id: str  # the shards commit the tag points at
    committed_at: str  # ISO 8601, UTC
    num_samples: dict[str, int]  # split -> samples, from the manifest at the commit
    checks: dict[str, DataCheck]  # "raw_dataset" / "shards" -> the report at the commit
    models: tuple[str, ...]  # "<model> v<N>" of every published model version trained on it

    def to_dict(self) -> dict:
        return asdict(self)


# --- names ------------------------------------------------------------------------------------------
def dataset_tag(dataset: str, number: int) -> str:
    tag = f"{dataset}-d{number}"
    # Only names parse_dataset_tag reads back: another spelling would never count as a version.
    if parse_dataset_tag(tag) != (dataset, number):
        raise ValueError(f"no dataset version {number} of {dataset!r}: datasets are named with lowercase letters, "
                         "digits and '_' (like pipelines), and versions count from 1")
    return tag


def parse_dataset_tag(tag: str) -> tuple[str, int] | None:
    """(dataset, N) of a dataset tag; None for any other tag (a model's ``<model>-v<N>`` included)."""
    m = _DATASET_TAG.fullmatch(tag)
    return (m.group("dataset"), int(m.group("number"))) if m else None


def shards_prefix(dataset: str) -> str:
    return f"datasets/{dataset}/shards/"


def manifest_path(dataset: str) -> str:
    return shards_prefix(dataset) + "manifest.json"


def validation_report_path(dataset: str, asset: str) -> str:
    return f"datasets/{dataset}/validation/{asset}.json"


# --- listing ----------------------------------------------------------------------------------------
def _all_tags(store: VersionedStore) -> dict[str, str]:
    try:
        return store.list_tags()
    except RefNotFoundError as exc:
        raise UnknownDatasetVersionError(
            f"the store holds no published datasets yet ({exc}); run a pipeline's training job first"
        ) from exc


def dataset_tags(store: VersionedStore, dataset: str) -> dict[int, str]:
    """Version number -> shards commit id of every published version of ``dataset``, oldest first."""
    found = {}
    for tag, commit_id in _all_tags(store).items():
        parsed = parse_dataset_tag(tag)
        if parsed and parsed[0] == dataset:
            found[parsed[1]] = commit_id
    return dict(sorted(found.items()))


def published_datasets(store: VersionedStore) -> list[str]:
    """Datasets with at least one published version."""
    return sorted({parsed[0] for tag in _all_tags(store) if (parsed := parse_dataset_tag(tag))})


def list_dataset_versions(store: VersionedStore, dataset: str) -> list[DatasetVersion]:
    """Every published version of ``dataset``, oldest first, with what it holds and who trained on it."""
    tags = dataset_tags(store, dataset)
    records = published_lineage_records(store) if tags else []
    return [_describe_version(store, dataset, number, commit_id, records) for number, commit_id in tags.items()]


def _describe_version(store: VersionedStore, dataset: str, number: int, commit_id: str,
                      records: list[dict]) -> DatasetVersion:
    tag = dataset_tag(dataset, number)
    manifest = json.loads(store.get_object(commit_id, manifest_path(dataset)))
    committed = datetime.fromtimestamp(store.get_commit(commit_id).creation_date, timezone.utc)
    return DatasetVersion(
        dataset=dataset, tag=tag, number=number, commit_id=commit_id,
        committed_at=committed.isoformat(timespec="seconds"),
        num_samples={split: body["num_samples"] for split, body in manifest["splits"].items()},
        checks=_data_checks(store, dataset, commit_id),
        models=tuple(f"{r['model']} v{r['version']}" for r in records if _trained_on(r, dataset, tag, commit_id)))


def _data_checks(store: VersionedStore, dataset: str, commit_id: str) -> dict[str, DataCheck]:
    """The validation reports at ``commit_id``; a report the commit lacks is left out, not invented."""
    checks = {}
    for asset in CHECKED_ASSETS:
        path = validation_report_path(dataset, asset)
        if not store.exists(commit_id, path):
            continue
        report = json.loads(store.get_object(commit_id, path))
        checks[asset] = DataCheck(passed=bool(report["passed"]), expectations=int(report["evaluated"]),
                                  failed=int(report["failed"]))
    return checks


def _trained_on(record: dict, dataset: str, tag: str, commit_id: str) -> bool:
    """A record names its dataset version; records older than that field match by shards commit."""
    data = record["data"]
    if data.get("dataset") != dataset:
        return False
    return data.get("dataset_version") == tag or data["shards_commit"] == commit_id


def published_lineage_records(store: VersionedStore) -> list[dict]:
    """The lineage record of every model version on ``main``, by model and version.

    Read from ``main`` rather than through model tags so that a version whose tag a store failure
    delayed (``core.versions.repair_untagged_versions`` adds it later) still counts: it is published.
    """
    paths = [o.path for o in store.list_objects(MAIN, prefix="models/") if _LINEAGE_ON_MAIN.fullmatch(o.path)]
    records = [json.loads(store.get_object(MAIN, path)) for path in paths]
    return sorted(records, key=lambda r: (r["model"], r["version"]))


# --- resolving a version a user names ---------------------------------------------------------------
def resolve_dataset_version(store: VersionedStore, dataset: str, version: str | int | None) -> tuple[str, str]:
    """(tag, shards commit id) of ``version``: a tag (``digits-d2``), ``d2`` or ``2``; None: the newest."""
    tags = dataset_tags(store, dataset)
    if not tags:
        others = published_datasets(store)
        raise UnknownDatasetVersionError(
            f"dataset {dataset!r} has no published versions"
            + (f" (datasets with versions: {', '.join(others)})" if others else "")
            + f"; a version is published when a model trained on it registers: run the {dataset}_training job")
    number = max(tags) if version is None else _version_number(dataset, version, tags)
    if number not in tags:
        raise UnknownDatasetVersionError(
            f"dataset {dataset!r} has no version {version!r}; published versions: {_names(dataset, tags)}. "
            "Give one of those tags, its number, or nothing for the newest")
    return dataset_tag(dataset, number), tags[number]


def _version_number(dataset: str, version: str | int, tags: dict[int, str]) -> int:
    text = str(version).strip()
    if re.fullmatch(r"d?[1-9][0-9]*", text):
        return int(text.lstrip("d"))
    parsed = parse_dataset_tag(text)
    if parsed is None or parsed[0] != dataset:
        raise UnknownDatasetVersionError(
            f"{version!r} is not a version of dataset {dataset!r}; use a tag such as "
            f"{dataset_tag(dataset, max(tags))!r}, or its number; published versions: {_names(dataset, tags)}")
    return parsed[1]


def _names(dataset: str, tags: dict[int, str]) -> str:
    return ", ".join(dataset_tag(dataset, n) for n in tags)


# --- reusing and tagging -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Reuse:
    """What a run on data with key ``wanted`` finds among the published versions."""

    tag: str | None  # the version to reuse; None: make new data
    commit_id: str | None  # its shards commit
    manifest: dict | None  # its manifest
    changed: tuple[str, ...]  # without a version to reuse: the key's parts that differ from the newest's
    newest: str | None  # the newest version's tag, if any
    newest_commit: str | None = None  # its shards commit, when only its sources differ from the run's


def reusable_version(store: VersionedStore, dataset: str, wanted: Mapping[str, str]) -> Reuse:
    """The newest published version of ``dataset`` when its manifest's data key equals ``wanted``
    (the same raw content, preprocessing and code); else which parts of the key changed.

    Only the newest version is compared: "newest" must always name the data ``main`` holds, so
    data that returns to an older version's content is a new version, not a step back. A tag
    that a published record claims but the store lacks is created first, as planning does, so
    "newest" counts it."""
    try:
        repair_claimed_dataset_tags(store, dataset)
        tags = dataset_tags(store, dataset)
    except UnknownDatasetVersionError:
        tags = {}  # a store without a repository yet: nothing published
    if not tags:
        return Reuse(None, None, None, ("no published version",), None)
    number = max(tags)
    tag, commit_id = dataset_tag(dataset, number), tags[number]
    manifest = json.loads(store.get_object(commit_id, manifest_path(dataset)))
    published = manifest.get(DATA_KEY) or {}
    if published.get("sha256") != wanted["sha256"]:
        changed = changed_parts(wanted, published)
        # Only the files differ: a kind kept in parts builds on that version's parts
        # (assets/kinds/image_parts.py), if its reports say it passed as a published version must.
        base = commit_id if changed == ("sources",) and _passed(store, dataset, commit_id) else None
        return Reuse(None, None, None, changed, tag, base)
    if not _passed(store, dataset, commit_id):
        # A version is published only after both suites passed; one whose reports say otherwise
        # is not taken as is: its data is made and checked again.
        return Reuse(None, None, None, ("checks",), tag)
    return Reuse(tag, commit_id, manifest, (), tag)


def _passed(store: VersionedStore, dataset: str, commit_id: str) -> bool:
    checks = _data_checks(store, dataset, commit_id)
    return set(checks) == set(CHECKED_ASSETS) and all(c.passed for c in checks.values())


def changed_parts(wanted: Mapping[str, str], published: Mapping[str, str]) -> tuple[str, ...]:
    """The parts of a data key that differ from a published version's (all, when it has no key:
    shards made before data keys)."""
    if not published:
        return DATA_KEY_PARTS
    return tuple(p for p in DATA_KEY_PARTS if wanted.get(p) != published.get(p))


def plan_dataset_version(store: VersionedStore, dataset: str, shards_commit: str) -> str:
    """The tag that names the shards of ``dataset`` at ``shards_commit`` once they are published.

    The tag already on that commit (a reused version, a retry, a second model trained in the
    same run); else one past the highest version. Tags that published lineage records claim are
    created first, so a name a published model version already states is never handed to other
    data."""
    repair_claimed_dataset_tags(store, dataset)
    tags = dataset_tags(store, dataset)
    on_commit = [n for n, commit_id in tags.items() if commit_id == shards_commit]
    if on_commit:
        return dataset_tag(dataset, on_commit[0])
    return dataset_tag(dataset, max(tags, default=0) + 1)


def version_disagreements(store: VersionedStore, dataset: str) -> list[str]:
    """Published lineage records that name a version of ``dataset`` beside another commit than the
    one its tag points at: one line each. Empty wherever versions are exact."""
    tags = dataset_tags(store, dataset)
    out = []
    for r in published_lineage_records(store):
        data = r["data"]
        parsed = parse_dataset_tag(data.get("dataset_version") or "")
        if data.get("dataset") == dataset and parsed and parsed[0] == dataset and parsed[1] in tags \
                and tags[parsed[1]] != data["shards_commit"]:
            out.append(f"{r['model']} v{r['version']} names {data['dataset_version']} (commit "
                       f"{tags[parsed[1]][:12]}) but trained on commit {data['shards_commit'][:12]}")
    return out


def tag_published_dataset(store: VersionedStore, dataset: str, shards_commit: str, planned: str | None = None,
                          attempts: int = 5) -> str:
    """Tag the published ``shards_commit`` as a version of ``dataset``; return the tag naming its data.

    Idempotent: a commit that already has a version keeps it. Two taggers racing for one number:
    the store refuses the second ``create_tag``; it re-reads the tags, accepts the winner's tag
    when it is on the same commit, and otherwise plans again (the next number). With ``planned``
    (a name a lineage record already states) there is no other name to fall back to: another
    commit holding that tag is an inconsistency and raises StoreError.
    """
    for _ in range(attempts):
        tag = planned or plan_dataset_version(store, dataset, shards_commit)
        if _create_or_accept(store, dataset, tag, shards_commit):
            return tag
        if planned:
            holder = store.list_tags()[tag]
            raise StoreError(
                f"dataset tag {tag!r} points at commit {holder}, not at the published commit {shards_commit}, "
                f"yet a lineage record names {tag!r} for the latter; tags are immutable: compare "
                f"`python -m pipelines datasets {dataset}` with the records and fix the tag by hand")
    raise StoreError(
        f"could not tag a version of dataset {dataset!r} at {shards_commit}: {attempts} attempts lost the race for "
        "a version number to other publications; run the tagging again")


def _create_or_accept(store: VersionedStore, dataset: str, tag: str, shards_commit: str) -> bool:
    """Create ``tag`` at ``shards_commit``; True when it now names that commit (created here or by a
    concurrent tagger of the same commit), False when it names another (this tagger lost the number)."""
    holder = store.list_tags().get(tag)
    if holder is None:
        try:
            store.create_tag(tag, shards_commit)
            return True
        except StoreError:
            # Neither backend has a distinct "tag exists" error (lakeFS answers 409, local a plain
            # StoreError): re-read; if the tag is still missing, the failure was something else.
            holder = store.list_tags().get(tag)
            if holder is None:
                raise
    return holder == shards_commit


def repair_claimed_dataset_tags(store: VersionedStore, dataset: str) -> list[str]:
    """Create the tags that published lineage records name but the store lacks; return them.

    A registration plans its tag, publishes the record, then tags: a store failure in between
    leaves a published record naming a missing tag, which must go on that record's shards.
    """
    existing = dataset_tags(store, dataset)
    claims: dict[int, str] = {}
    for record in published_lineage_records(store):
        parsed = parse_dataset_tag(record["data"].get("dataset_version") or "")
        if parsed and parsed[0] == dataset and parsed[1] not in existing:
            claims.setdefault(parsed[1], record["data"]["shards_commit"])
    repaired = []
    for number, shards_commit in sorted(claims.items()):
        tag = dataset_tag(dataset, number)
        if not _create_or_accept(store, dataset, tag, shards_commit):
            raise StoreError(
                f"dataset tag {tag!r} was created at another commit while a published lineage record names it for "
                f"commit {shards_commit}; compare `python -m pipelines datasets {dataset}` with the records")
        repaired.append(tag)
    return repaired
