"""Store housekeeping, planned before anything is deleted: old run branches, checkpoints of runs
that never registered a version, and old reproductions.

Nothing a registered model version's lineage points at is ever planned for deletion: its commits
(a run branch holding one that is not on ``main`` stays), its checkpoint's artifact key and URI,
and the checkpoint work dir of its run. Dagster-free: what the orchestrator knows (runs still in
flight, commits the latest materializations point at) comes in as an ``InUse``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from core.lineage import commit_ids
from core.registry import list_models, list_versions, read_lineage
from resources.artifacts.base import ArtifactStore
from resources.store.base import MAIN, Commit, StoreError, VersionedStore

RUN_BRANCH_PREFIX = "run-"
# The CLI's reproduce command writes each reproduction under <data root>/reproductions/.
REPRODUCTIONS_DIR = "reproductions"
# Where the training op puts a run's checkpoint, in the store and in the artifact store alike.
CHECKPOINT_KEY = re.compile(r"^models/(?P<model>[^/]+)/checkpoints/(?P<run_id>[^/]+)/.+$")
# The training op's local work dir: <checkpoints root>/<model>/<root run id>/{checkpoints,output}.
WORK_DIR_WEIGHTS = Path("output") / "model.safetensors"

# Branch logs are read until the first commit on main; a run branch longer than this is kept
# rather than judged on a partial history.
BRANCH_LOG_LIMIT = 1000
MAIN_LOG_LIMIT = 100_000

RUN_BRANCH = "run-branch"
ARTIFACT = "artifact"
CHECKPOINT_DIR = "checkpoint-dir"
REPRODUCTION = "reproduction"
KINDS = (RUN_BRANCH, ARTIFACT, CHECKPOINT_DIR, REPRODUCTION)

DAY_S = 86_400.0


class HousekeepingError(StoreError):
    """A plan that cannot be made safely, or a deletion that failed part-way."""

    def __init__(self, message: str, deleted: tuple["PlannedDeletion", ...] = ()):
        super().__init__(message)
        self.deleted = deleted


@dataclass(frozen=True)
class InUse:
    """What the orchestrator says is still in use.

    ``run_ids``: runs not finished, with their root and parent runs (a retry resumes from its
    root run's checkpoint dir). ``commits``: commits the latest asset materializations point at
    (a later run reads them, e.g. shards that live only on their run branch).
    """

    run_ids: frozenset[str] = frozenset()
    commits: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PlannedDeletion:
    kind: str  # one of KINDS
    target: str  # branch name, artifact key, or absolute directory path
    reason: str
    # What must still hold when the plan is applied: a branch's head commit, a directory's
    # newest modification time; empty for artifact keys (the interface gives no version).
    fingerprint: str = ""


@dataclass(frozen=True)
class Kept:
    """Something old enough to go that stays, and why (answers "why is X still there?")."""

    kind: str
    target: str
    reason: str


@dataclass(frozen=True)
class HousekeepingPlan:
    created_at: float
    older_than_days: float
    deletions: tuple[PlannedDeletion, ...]
    kept: tuple[Kept, ...]

    def targets(self, kind: str) -> list[str]:
        return [d.target for d in self.deletions if d.kind == kind]

    def counts(self) -> dict[str, int]:
        found = Counter(d.kind for d in self.deletions)
        return {kind: found[kind] for kind in KINDS}


@dataclass(frozen=True)
class AppliedPlan:
    deleted: tuple[PlannedDeletion, ...]
    # Planned deletions left alone because the target changed or went since planning.
    skipped: tuple[tuple[PlannedDeletion, str], ...] = field(default=())


# --- what registered versions point at ----------------------------------------------------------

@dataclass(frozen=True)
class LineageRefs:
    """Everything registered versions' lineage records point at, each mapped to a version label."""

    commits: dict[str, str]
    run_ids: dict[str, str]  # the registering Dagster run and the run that trained the checkpoint
    artifact_keys: dict[str, str]
    artifact_uris: dict[str, str]
    weights_sha256: dict[str, str]


def lineage_refs(store: VersionedStore) -> LineageRefs:
    commits, run_ids, keys, uris, shas = {}, {}, {}, {}, {}
    for model in list_models(store):
        for version in list_versions(store, model):
            label = f"{model} v{version}"
            record = read_lineage(store, model, version)
            commits.update(dict.fromkeys(commit_ids(record).values(), label))
            try:
                checkpoint, run_id = record["checkpoint"], record["dagster"]["run_id"]
                store_path, uri, sha = checkpoint["store_path"], checkpoint["uri"], checkpoint["sha256"]
            except KeyError as exc:
                raise HousekeepingError(
                    f"the lineage record of {label} has no {exc}; without it housekeeping cannot tell which "
                    "checkpoints the version uses, so it plans nothing. Repair the record first.") from exc
            run_ids[run_id] = label
            if match := CHECKPOINT_KEY.match(store_path):
                run_ids[match["run_id"]] = label
            keys[store_path], uris[uri], shas[sha] = label, label, label
    return LineageRefs(commits=commits, run_ids=run_ids, artifact_keys=keys, artifact_uris=uris, weights_sha256=shas)


def lineage_commits(store: VersionedStore) -> set[str]:
    """Every commit any registered model version's lineage record points at."""
    out: set[str] = set()
    for model in list_models(store):
        for version in list_versions(store, model):
            out.update(commit_ids(read_lineage(store, model, version)).values())
    return out


# --- run branches ---------------------------------------------------------------------------------

def run_id_of_branch(name: str) -> str:
    """``run-<id>``, or ``run-<id>-r<k>`` for register_version's retries after a lost race."""
    return re.sub(r"-r\d+$", "", name.removeprefix(RUN_BRANCH_PREFIX))


def main_commit_ids(store: VersionedStore) -> set[str]:
    """Every commit on main. Run branches are judged merged or not against all of main's
    history, never a part of it: past MAIN_LOG_LIMIT commits, housekeeping plans nothing."""
    commits = store.log(MAIN, limit=MAIN_LOG_LIMIT + 1)
    if len(commits) > MAIN_LOG_LIMIT:
        raise HousekeepingError(
            f"main has more than {MAIN_LOG_LIMIT:,} commits, so housekeeping cannot read all of it to tell "
            "merged run branches from unmerged ones; it plans nothing rather than judge them on part of the "
            "history. Raise core.housekeeping.MAIN_LOG_LIMIT.")
    return {c.id for c in commits}


def own_commits(store: VersionedStore, branch: str, on_main: set[str]) -> list[Commit] | None:
    """The branch's commits that are not on main, newest first; None if there are more than
    BRANCH_LOG_LIMIT. Run branches only ever receive their run's commits (main is never merged
    into them), so they all come before the first commit that is on main."""
    out = []
    for commit in store.log(branch, limit=BRANCH_LOG_LIMIT):
        if commit.id in on_main:
            return out
        out.append(commit)
    return out if len(out) < BRANCH_LOG_LIMIT else None


def judge_run_branch(store: VersionedStore, name: str, head: str, on_main: set[str], protected: dict[str, str],
                     cutoff: float) -> PlannedDeletion | Kept | None:
    """Delete, keep (with why), or None for a branch too recent to consider."""
    own = own_commits(store, name, on_main)
    if own is None:
        return Kept(RUN_BRANCH, name, f"more than {BRANCH_LOG_LIMIT} commits are not on main; inspect it by hand")
    if not own:
        return PlannedDeletion(RUN_BRANCH, name, "merged: every commit on it is on main", head)
    if own[0].creation_date >= cutoff:
        return None
    holding = next((c for c in own if c.id in protected), None)
    if holding is not None:
        return Kept(RUN_BRANCH, name, f"holds commit {holding.id[:12]}, not on main, used by {protected[holding.id]}")
    age_days = (cutoff - own[0].creation_date) / DAY_S
    return PlannedDeletion(RUN_BRANCH, name, f"not merged; {len(own)} commit(s) not on main, head older than the "
                                             f"cutoff by {age_days:.1f} day(s), no registered version uses them", head)


def stale_run_branches(store: VersionedStore, older_than_s: float, now: float | None = None) -> list[str]:
    """Run branches whose removal loses nothing a registered version points at, judged on the
    store alone: runs still in flight are unknown here, so plan_housekeeping excludes those."""
    now = time.time() if now is None else now
    refs = lineage_commits(store)
    on_main = main_commit_ids(store)
    judged = [judge_run_branch(store, name, head, on_main, dict.fromkeys(refs, "a registered version"),
                               now - older_than_s)
              for name, head in sorted(store.list_branches().items()) if name.startswith(RUN_BRANCH_PREFIX)]
    return [j.target for j in judged if isinstance(j, PlannedDeletion)]


def plan_run_branches(store: VersionedStore, branches: dict[str, str], refs: LineageRefs, in_use: InUse,
                      cutoff: float) -> list[PlannedDeletion | Kept]:
    on_main = main_commit_ids(store)
    # Commits the orchestrator still reads count like lineage commits: their branch stays.
    protected = {**dict.fromkeys(in_use.commits, "the latest materialization of an asset"), **refs.commits}
    out: list[PlannedDeletion | Kept] = []
    for name, head in sorted(branches.items()):
        if not name.startswith(RUN_BRANCH_PREFIX):
            continue
        if run_id_of_branch(name) in in_use.run_ids:
            out.append(Kept(RUN_BRANCH, name, "its run is still in flight"))
            continue
        judged = judge_run_branch(store, name, head, on_main, protected, cutoff)
        if judged is not None:
            out.append(judged)
    return out


# --- checkpoints ----------------------------------------------------------------------------------

def plan_artifacts(store: VersionedStore, artifacts: ArtifactStore, branches: dict[str, str], refs: LineageRefs,
                   in_use: InUse, cutoff: float) -> list[PlannedDeletion | Kept]:
    """Checkpoint keys ``models/<model>/checkpoints/<run_id>/...``; their age is their run branch's
    head (the training op commits the same path there), since artifact stores report no dates."""
    out: list[PlannedDeletion | Kept] = []
    for key in artifacts.list_keys("models/"):
        match = CHECKPOINT_KEY.match(key)
        if match is None:
            continue
        run_id = match["run_id"]
        branch = RUN_BRANCH_PREFIX + run_id
        head = branches.get(branch)
        if head is not None and store.get_commit(head).creation_date >= cutoff:
            continue
        user = (refs.artifact_keys.get(key) or refs.artifact_uris.get(artifacts.uri(key))
                or refs.run_ids.get(run_id))
        if user is not None:
            out.append(Kept(ARTIFACT, key, f"checkpoint of registered {user}"))
        elif run_id in in_use.run_ids:
            out.append(Kept(ARTIFACT, key, f"its run {run_id} is still in flight"))
        elif head is None:
            out.append(Kept(ARTIFACT, key, f"its run branch {branch} is gone, so its age is unknown"))
        else:
            out.append(PlannedDeletion(ARTIFACT, key, f"run {run_id} registered no version and its branch "
                                                      f"{branch} is older than the cutoff"))
    return out


def plan_checkpoint_dirs(checkpoints_root: Path, refs: LineageRefs, in_use: InUse,
                         cutoff: float) -> list[PlannedDeletion | Kept]:
    out: list[PlannedDeletion | Kept] = []
    for work_dir in subdirectories(checkpoints_root, depth=2):
        newest = newest_mtime(work_dir)
        if newest >= cutoff:
            continue
        run_id = work_dir.name  # the root run of a retry chain
        user = refs.run_ids.get(run_id) or weights_user(work_dir, refs)
        if user is not None:
            out.append(Kept(CHECKPOINT_DIR, str(work_dir), f"checkpoint dir of registered {user}"))
        elif run_id in in_use.run_ids:
            out.append(Kept(CHECKPOINT_DIR, str(work_dir), f"its run {run_id} (or a retry of it) is still in flight"))
        else:
            out.append(PlannedDeletion(CHECKPOINT_DIR, str(work_dir),
                                       f"run {run_id} registered no version; untouched for "
                                       f"{days_before(cutoff, newest)} day(s) past the cutoff", repr(newest)))
    return out


def weights_user(work_dir: Path, refs: LineageRefs) -> str | None:
    """The version whose weights this work dir produced: a retry registers under its own run id
    but trains in its root run's dir, so the dir name alone does not say."""
    weights = work_dir / WORK_DIR_WEIGHTS
    if not weights.is_file():
        return None
    digest = hashlib.sha256()
    with weights.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return refs.weights_sha256.get(digest.hexdigest())


# --- reproductions --------------------------------------------------------------------------------

def reproductions_root(data_root: Path) -> Path:
    return Path(data_root) / REPRODUCTIONS_DIR


def plan_reproductions(root: Path, cutoff: float) -> list[PlannedDeletion]:
    out = []
    for work_dir in subdirectories(root, depth=1):
        newest = newest_mtime(work_dir)
        if newest < cutoff:
            out.append(PlannedDeletion(REPRODUCTION, str(work_dir),
                                       f"untouched for {days_before(cutoff, newest)} day(s) past the cutoff",
                                       repr(newest)))
    return out


# --- files ----------------------------------------------------------------------------------------

def subdirectories(root: Path, depth: int) -> list[Path]:
    """Directories exactly ``depth`` levels below ``root`` (symlinks are not followed)."""
    level = [Path(root)] if Path(root).is_dir() else []
    for _ in range(depth):
        level = sorted(p for d in level for p in d.iterdir() if p.is_dir() and not p.is_symlink())
    return level


def newest_mtime(path: Path) -> float:
    """The latest modification anywhere in the tree: a run still writing checkpoints is recent."""
    newest = path.lstat().st_mtime
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
    return newest


def days_before(cutoff: float, when: float) -> str:
    return f"{(cutoff - when) / DAY_S:.1f}"


# --- the plan -------------------------------------------------------------------------------------

def plan_housekeeping(store: VersionedStore, artifacts: ArtifactStore, checkpoints_root: Path,
                      reproductions_root: Path, *, older_than_days: float, in_use: InUse,
                      now: float | None = None) -> HousekeepingPlan:
    """What housekeeping would delete and why; deletes nothing.

    ``in_use`` is required: without the orchestrator's word, a run that just started (its branch
    still at main's old head) would look stale.
    """
    if older_than_days <= 0:
        raise ValueError(f"older_than_days must be positive, got {older_than_days}")
    now = time.time() if now is None else now
    cutoff = now - older_than_days * DAY_S
    # A store without a repository raises here: with no registered versions to protect, every
    # old checkpoint would look orphaned, and a misconfigured store must not cause that.
    refs = lineage_refs(store)
    branches = store.list_branches()
    judged = [
        *plan_run_branches(store, branches, refs, in_use, cutoff),
        *plan_artifacts(store, artifacts, branches, refs, in_use, cutoff),
        *plan_checkpoint_dirs(Path(checkpoints_root), refs, in_use, cutoff),
        *plan_reproductions(Path(reproductions_root), cutoff),
    ]
    return HousekeepingPlan(
        created_at=now, older_than_days=older_than_days,
        deletions=tuple(j for j in judged if isinstance(j, PlannedDeletion)),
        kept=tuple(j for j in judged if isinstance(j, Kept)),
    )


# --- applying it ----------------------------------------------------------------------------------

def apply_plan(plan: HousekeepingPlan, store: VersionedStore, artifacts: ArtifactStore) -> AppliedPlan:
    """Delete what the plan lists; a target that changed or went since planning is skipped.

    A failed deletion stops here with HousekeepingError, whose ``deleted`` says what already went.
    """
    branches = store.list_branches()
    deleted: list[PlannedDeletion] = []
    skipped: list[tuple[PlannedDeletion, str]] = []
    for item in plan.deletions:
        change = changed_since_planning(item, branches, artifacts)
        if change is not None:
            skipped.append((item, change))
            continue
        try:
            delete(item, store, artifacts)
        except Exception as exc:  # re-raised with what already went, so the caller can report it
            raise HousekeepingError(
                f"deleted {len(deleted)} of {len(plan.deletions)} planned item(s), then could not delete "
                f"{item.kind} {item.target}: {exc}", deleted=tuple(deleted)) from exc
        deleted.append(item)
    return AppliedPlan(deleted=tuple(deleted), skipped=tuple(skipped))


def changed_since_planning(item: PlannedDeletion, branches: dict[str, str], artifacts: ArtifactStore) -> str | None:
    if item.kind == RUN_BRANCH:
        head = branches.get(item.target)
        if head is None:
            return "already gone"
        return None if head == item.fingerprint else f"its head moved to {head[:12]} since planning"
    if item.kind == ARTIFACT:
        return None if artifacts.exists(item.target) else "already gone"
    path = Path(item.target)
    if not path.is_dir():
        return "already gone"
    return None if repr(newest_mtime(path)) == item.fingerprint else "written to since planning"


def delete(item: PlannedDeletion, store: VersionedStore, artifacts: ArtifactStore) -> None:
    if item.kind == RUN_BRANCH:
        store.delete_branch(item.target)
    elif item.kind == ARTIFACT:
        artifacts.delete(item.target)
    elif item.kind in (CHECKPOINT_DIR, REPRODUCTION):
        shutil.rmtree(item.target)
    else:
        raise HousekeepingError(f"unknown kind {item.kind!r} in the plan; expected one of {', '.join(KINDS)}")


# --- text -----------------------------------------------------------------------------------------

def format_plan(plan: HousekeepingPlan) -> str:
    """One line per item (delete or keep, kind, what, reason) and a summary line."""
    rows = [("delete", d.kind, d.target, d.reason) for d in plan.deletions]
    rows += [("keep", k.kind, k.target, k.reason) for k in plan.kept]
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}" for a, b, c, d in rows]
    counts = ", ".join(f"{n} {kind}" for kind, n in plan.counts().items() if n) or "nothing"
    lines.append(f"{len(plan.deletions)} to delete ({counts}), {len(plan.kept)} kept; "
                 f"older than {plan.older_than_days:g} day(s)")
    return "\n".join(lines)
