"""What every dataset sharded over Dagster steps shares (image folders: assets/image_shard_steps.py,
tables: assets/table_shard_steps.py, text corpora: assets/text_shard_steps.py): the new parts cut
into groups, a step each, and the version's parts put back in order from the groups' results and
the parts the published version already holds.

A part is named here by its *slot*: any text unique within the version's plan (an image part's key;
a table part's place in id order, since its key is known only once a step has read its rows)."""

from __future__ import annotations

from collections.abc import Mapping

from assets.sharding import CARRIED


def step_groups(parts: list[dict], kept: set[str], per_step: int) -> list[list[dict]]:
    """The parts to shard (those whose ``key`` is not in ``kept``), ``per_step`` to a group, in order."""
    todo = [p for p in parts if p["key"] not in kept]
    return [todo[i:i + per_step] for i in range(0, len(todo), per_step)]


def assemble_parts(slots: list[str], made: list[dict], kept: Mapping[str, tuple[dict, dict]],
                   names: list[str] | None = None) -> tuple[list[tuple[dict, dict]], list[str], dict[str, str]]:
    """(every part's (record, shard entries per split) in the order of ``slots``, the groups' file
    failures, staged shard path -> the branch a step staged it on).

    ``made``: the groups' results, each with its parts' ``slots``, ``records`` and ``entries`` (in
    that order), its ``failures``, and the ``branch`` and store ``prefix`` it staged its files
    under. ``kept``: slot -> (record, entries) of the parts no step made. A slot in neither is a
    part no step sharded (a re-execution that lost a group's output): the version cannot be whole."""
    by_slot, failures, staged = {}, [], {}
    for group in made:
        failures += group["failures"]
        for slot, record, entries in zip(group["slots"], group["records"], group["entries"], strict=True):
            by_slot[slot] = (record, entries)
            staged.update({group["prefix"] + e["path"]: group["branch"] for es in entries.values() for e in es
                           if not e.get(CARRIED)})  # a kept file is the previous version's, not staged
    ordered = []
    for i, slot in enumerate(slots):
        if slot in by_slot:
            ordered.append(by_slot[slot])
        elif slot in kept:
            ordered.append(kept[slot])
        else:
            raise RuntimeError(f"part {(names or slots)[i]} was sharded by no step and is not in the previous "
                               "version; re-execute the whole run")
    return ordered, failures, staged


def carry_raw_commit(context, store, raw: dict, branch: str) -> int:
    """Stage on ``branch`` what the raw copy's commit changed, when that commit is on another run's
    branch: a re-execution from failure runs on a branch of its own, made from main, which the
    first run's raw commit never reached; without this the version would reach main without its
    raw copy. Returns how many paths it staged (0 for a run that committed its raw copy itself).

    The store copies each changed path from the commit (``copy_object``): on lakeFS no byte of a
    raw copy, terabytes for a large corpus, passes through this step."""
    if raw.get("branch") in (None, branch):
        return 0
    commit = store.get_commit(raw["commit_id"])
    changes = store.diff(commit.parents[0], commit.id) if commit.parents else []
    for change in changes:
        if change.type == "removed":
            if store.exists(branch, change.path):
                store.delete_object(branch, change.path)
            continue
        store.copy_object(commit.id, change.path, branch)
    if changes:
        context.log.info(f"{raw['dataset']}: the raw copy's commit {raw['commit_id'][:12]} was made on "
                         f"{raw['branch']}, the branch of an earlier run: its {len(changes)} change(s) staged here by "
                         "the store's copy (no byte through this step), to be committed with the shards")
    return len(changes)
