"""The soak's invariants, checked in rounds while it runs and once more at the end.

The checks read the store directly (not through the fault proxy: an observer must neither suffer
nor use up the faults), the artifact store (SeaweedFS), the training volume and the instance.
Each counts what it checked; each breach is a ``Violation``. A read that fails because a fault
has the artifact store down is not a breach: that version is checked again in a later round,
and the last round runs with every service up, so nothing goes unchecked.

- lineage: each registered version's tag holds a lineage record naming its model and version,
  whose bytes are those the tagged commit's metadata hashed, and whose commits (raw, shards,
  checkpoint), dataset version tag and shard manifest all resolve in the store;
- weights: the version's weights, in its folder, at its checkpoint commit and in the artifact
  store, hash to the sha256 the record holds;
- main: every commit in main's history holds only complete version folders (record, weights,
  card; the record naming that folder's version) and complete shard sets (every file its
  manifest lists, at the size it lists);
- listed: every checkpoint a training directory lists verifies against its manifest (full and
  sharded), and every published dataset version's shard files hash as its manifest says;
- runs and Pipes messages: runs.py; the services: the webserver answers and the daemon's
  heartbeats are fresh; the footprint: footprint.py.
"""

from __future__ import annotations

import hashlib
import json
import threading
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.datasets import manifest_path, parse_dataset_tag
from core.lineage import commit_ids, lineage_sha256
from core.registry import lineage_path, list_models, list_versions, read_lineage, version_prefix, version_tag
from resources.store.base import MAIN, RefNotFoundError
from tests.reliability.soak import runs as run_checks
from training_runtime.checkpoint.full import list_checkpoints, verify_checkpoint

INVARIANTS = {
    "lineage": "every registered version's lineage resolves",
    "weights": "the weights match the recorded sha256",
    "main": "main only ever moves to complete versions",
    "listed": "no half-written checkpoint or shard set is listed",
    "runs": "every run ends in success, a named failure, or a retry that succeeded",
    "pipes": "every Pipes message a rank wrote reached Dagster",
    "services": "the daemon and the webserver are still up",
    "footprint": "the process and disk footprint stay bounded",
}
VERSION_FILES = ("lineage.json", "model.safetensors", "model_card.json")
MAIN_LOG_LIMIT = 100_000


@dataclass
class Violation:
    invariant: str
    at: float
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Checker:
    platform: object  # SoakPlatform
    instance: object  # DagsterInstance
    clock: object
    faults: list  # the scheduler's Fault records (read: which runs lost their run worker)
    checks: Counter = field(default_factory=Counter)  # invariant -> items checked
    rounds: int = 0
    violations: list[Violation] = field(default_factory=list)
    message_counts: dict = field(default_factory=dict)  # run id -> runs.MessageCount
    outcomes: dict = field(default_factory=dict)  # run id -> runs.RunOutcome (the last round's)
    _versions_done: set = field(default_factory=set)
    _commits_done: set = field(default_factory=set)
    _folders_done: dict = field(default_factory=dict)  # (commit-independent) folder -> lineage checksum
    _datasets_done: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.store = self.platform.store_resource(through_faults=False).get()

    def violation(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(invariant, self.clock.now(), detail))

    # --- a round ----------------------------------------------------------------------------------
    def round(self, *, final: bool = False) -> None:
        with self._lock:
            self.rounds += 1
            for name, check in (("services", self.check_services), ("lineage", self.check_versions),
                                ("main", self.check_main), ("listed", self.check_checkpoints),
                                ("listed", self.check_datasets), ("pipes", self.check_messages)):
                try:
                    check()
                except Exception:  # noqa: BLE001 - a check that cannot run is itself a finding
                    self.violation(name, f"the check could not run: {traceback.format_exc()[-1500:]}")
            if final:
                self.check_runs()

    def check_services(self) -> None:
        self.checks["services"] += 2
        problem = self.platform.webserver_answers()
        if problem:
            self.violation("services", problem)
        problem = self.platform.daemon_alive(self.instance)
        if problem:
            self.violation("services", problem)

    # --- lineage and weights ----------------------------------------------------------------------
    def check_versions(self) -> None:
        try:
            models = list_models(self.store)
        except Exception as exc:  # noqa: BLE001
            if "no model versions yet" in str(exc):
                return
            raise
        tags = self.store.list_tags()
        for model in models:
            for version in list_versions(self.store, model):
                if (model, version) in self._versions_done:
                    continue
                if self._check_version(model, version, tags):
                    self._versions_done.add((model, version))

    def _check_version(self, model: str, version: int, tags: dict[str, str]) -> bool:
        """True when the version was checked whole (False: the artifact store was down; later)."""
        tag = version_tag(model, version)
        self.checks["lineage"] += 1
        try:
            record = read_lineage(self.store, model, version)
        except Exception as exc:  # noqa: BLE001 - an unreadable record is the breach itself
            self.violation("lineage", f"{tag}: the lineage record does not read: {exc}")
            return True
        data = self.store.get_object(tag, lineage_path(model, version))
        recorded = self.store.get_commit(tag).metadata.get("lineage_sha256")
        if recorded != lineage_sha256(data):
            self.violation("lineage", f"{tag}: lineage.json hashes to {lineage_sha256(data)}, the tagged commit "
                                      f"records {recorded}")
        if (record.get("model"), record.get("version")) != (model, version):
            self.violation("lineage", f"{tag}: the record names {record.get('model')} v{record.get('version')}")
        for name, commit in commit_ids(record).items():
            try:
                self.store.resolve_ref(commit)
            except RefNotFoundError:
                self.violation("lineage", f"{tag}: its {name} {commit} does not resolve")
        dataset_version = record["data"].get("dataset_version")
        if dataset_version and dataset_version not in tags:
            self.violation("lineage", f"{tag}: its dataset version {dataset_version} is not a tag")
        if not self.store.exists(record["data"]["shards_commit"], record["data"]["manifest_path"]):
            self.violation("lineage", f"{tag}: no shard manifest {record['data']['manifest_path']} at its shards "
                                      "commit")
        return self._check_weights(tag, model, version, record)

    def _check_weights(self, tag: str, model: str, version: int, record: dict) -> bool:
        expected = record["checkpoint"]["sha256"]
        copies = {"version folder": (tag, version_prefix(model, version) + "model.safetensors"),
                  "checkpoint commit": (record["checkpoint"]["commit"], record["checkpoint"]["store_path"])}
        for where, (ref, path) in copies.items():
            self.checks["weights"] += 1
            got = sha256(self.store.get_object(ref, path))
            if got != expected:
                self.violation("weights", f"{tag}: the weights in its {where} hash to {got}, the record says "
                                          f"{expected}")
        outages = self.platform.s3_outages
        try:
            data = self.platform.artifact_bytes(record["checkpoint"]["store_path"])
        except Exception as exc:  # noqa: BLE001
            if self.platform.s3_down or self.platform.s3_outages != outages:
                return False  # S3 was down (a fault): checked again in a later round
            self.violation("weights", f"{tag}: its weights are not in the artifact store "
                                      f"({record['checkpoint']['uri']}): {exc}")
            return True
        self.checks["weights"] += 1
        got = sha256(data)
        if got != expected:
            self.violation("weights", f"{tag}: the artifact store's weights hash to {got}, the record says {expected}")
        return True

    # --- main's history ----------------------------------------------------------------------------
    def check_main(self) -> None:
        for commit in self.store.log(MAIN, limit=MAIN_LOG_LIMIT):
            if commit.id in self._commits_done:
                continue
            self.checks["main"] += 1
            for problem in commit_problems(self.store, commit.id, self._folders_done):
                self.violation("main", problem)
            self._commits_done.add(commit.id)

    # --- what is listed -------------------------------------------------------------------------
    def check_checkpoints(self) -> None:
        root = self.platform.data_root / "checkpoints"
        if not root.is_dir():
            return
        for folder in sorted({p.parent for p in root.rglob("step_*") if p.is_dir()}):
            checked, problems = checkpoint_problems(folder)
            self.checks["listed"] += checked
            for problem in problems:
                self.violation("listed", problem)

    def check_datasets(self) -> None:
        for tag, commit in sorted(self.store.list_tags().items()):
            if not parse_dataset_tag(tag) or tag in self._datasets_done:
                continue
            checked, problems = dataset_problems(self.store, tag, commit)
            self.checks["listed"] += checked
            for problem in problems:
                self.violation("listed", problem)
            self._datasets_done.add(tag)

    # --- runs and their messages -----------------------------------------------------------------
    def receiver_killed_at(self) -> dict[str, float]:
        """Run id -> when the soak killed its run worker (unix time)."""
        return {f.target["run_id"]: f.unix for f in self.faults
                if f.injected and f.cls == "run_worker_kill" and f.target.get("run_id")}

    def check_messages(self) -> None:
        killed = self.receiver_killed_at()
        for run in self.instance.get_runs(run_checks_filter()):
            if run.run_id in self.message_counts:
                continue
            count = run_checks.count_messages(self.instance, self.platform.ledger_dir, run.run_id,
                                              receiver_killed_at=killed.get(run.run_id))
            self.message_counts[run.run_id] = count
            self.checks["pipes"] += count.checked
            if count.missing:
                shown = ", ".join(f"#{m['seq']} {m['method']}/{m.get('kind') or ''} step {m.get('step')}"
                                  for m in count.missing[:5])
                self.violation("pipes", f"run {run.run_id}: {len(count.missing)} of {count.required} messages rank 0 "
                                        f"wrote never reached its event log ({shown})")

    def check_runs(self) -> None:
        self.outcomes = run_checks.run_outcomes(self.instance)
        for out in self.outcomes.values():
            self.checks["runs"] += 1
            if out.verdict not in run_checks.OK_VERDICTS:
                self.violation("runs", f"run {out.run_id} ({out.model}, {out.status}): {out.verdict}"
                                       + (f": {out.message[:300]}" if out.message else ""))


def commit_problems(store, commit: str, folders_done: dict[str, str]) -> list[str]:
    """What is incomplete at ``commit``: version folders without their files (or whose record
    names another version) and shard sets missing a file their manifest lists, or holding it at
    another size. ``folders_done``: folder -> checksum of the lineage.json already read there."""
    problems = []
    objects = {o.path: o for o in store.list_objects(commit, prefix="models/")}
    folders = {p.rsplit("/", 1)[0] + "/" for p in objects if "/versions/v" in p}
    for folder in sorted(folders):
        missing = [f for f in VERSION_FILES if folder + f not in objects]
        if missing:
            problems.append(f"commit {commit[:12]} on main's history holds {folder} without {', '.join(missing)}")
            continue
        lineage = objects[folder + "lineage.json"]
        if folders_done.get(folder) == lineage.checksum:
            continue
        record = json.loads(store.get_object(commit, folder + "lineage.json"))
        if version_prefix(str(record.get("model")), record.get("version", -1)) != folder:
            problems.append(f"commit {commit[:12]}: {folder}lineage.json is the record of {record.get('model')} "
                            f"v{record.get('version')}")
        folders_done[folder] = lineage.checksum
    datasets = {o.path: o for o in store.list_objects(commit, prefix="datasets/")}
    for path in sorted(p for p in datasets if p.endswith("/shards/manifest.json")):
        prefix = path[: -len("manifest.json")]
        for entry in shard_entries(json.loads(store.get_object(commit, path))):
            found = datasets.get(prefix + entry["path"])
            if found is None or found.size_bytes != entry["num_bytes"]:
                problems.append(f"commit {commit[:12]}: shard set {prefix} lists {entry['path']} ({entry['num_bytes']} "
                                f"bytes); the commit holds {'none' if found is None else found.size_bytes}")
    return problems


def checkpoint_problems(folder: Path) -> tuple[int, list[str]]:
    """(checkpoints listed in ``folder``, those that do not verify against their manifest)."""
    listed = list_checkpoints(folder)
    problems = []
    for _, path in listed:
        try:
            verify_checkpoint(path)
        except (OSError, ValueError) as exc:
            gone = not path.exists()
            problems.append(f"{path} was listed but does not verify ({exc})" + (
                "; it vanished right after: it was being deleted in place while listed" if gone else ""))
    return len(listed), problems


def dataset_problems(store, tag: str, commit: str) -> tuple[int, list[str]]:
    """(shard files the dataset version's manifest lists, those it does not hold as listed)."""
    dataset, _ = parse_dataset_tag(tag)
    path = manifest_path(dataset)
    prefix = path[: -len("manifest.json")]
    entries = shard_entries(json.loads(store.get_object(commit, path)))
    problems = []
    for entry in entries:
        try:
            data = store.get_object(commit, prefix + entry["path"])
        except RefNotFoundError:
            problems.append(f"dataset version {tag} lists {entry['path']}, which it does not hold")
            continue
        if len(data) != entry["num_bytes"] or sha256(data) != entry["sha256"]:
            problems.append(f"dataset version {tag}: {entry['path']} does not match its manifest ({len(data)} bytes, "
                            f"sha256 {sha256(data)[:12]})")
    return len(entries), problems


def shard_entries(manifest: dict) -> list[dict]:
    return [e for split in manifest.get("splits", {}).values() for e in split.get("shards", [])]


def run_checks_filter():
    import dagster as dg

    return dg.RunsFilter(statuses=list(run_checks.FINISHED))
