"""The commands that annotate versions: ``comment``, ``promote`` and ``rollback``.

Each writes to the store (the record of truth) with the identity the platform verified
(core/identity.py: the store's lakeFS user, else the OS user marked as not authenticated; ``--by``
is only a note), and reports an observation, so the note or the alias move also shows in the
model version's history in the Dagster UI.
"""

from __future__ import annotations

import argparse

from core.identity import describe_entry, resolve_actor
from core.registry import add_comment, move_alias
from pipelines.cli.instance import report_observation
from pipelines.cli.lookup import require_model
from pipelines.profiles import Profile


def identity_metadata(entry: dict) -> dict:
    """How the entry's identity was verified, for the UI's observation."""
    return {"verified_by": entry["actor"]["verified_by"], "authenticated": entry["actor"]["authenticated"],
            **({"note": entry["note"]} if entry["note"] else {})}


def comment_command(args: argparse.Namespace) -> int:
    store = Profile.from_environment().store()
    require_model(args, store)
    note = add_comment(store, args.model, args.version, args.text, resolve_actor(store), note=args.note)
    report_observation(args.model, f"Comment on v{args.version} by {note['author']}: {note['text']}", {
        "kind": "comment", "version": args.version, "comment": note["text"], "author": note["author"],
        **identity_metadata(note), "store_path": note["path"], "store_commit": note["commit_id"]})
    print(f"Recorded comment on {args.model} v{args.version} by {describe_entry(note)} "
          f"(store commit {note['commit_id'][:12]}, {note['path']}).")
    return 0


def promote_command(args: argparse.Namespace) -> int:
    return _move_production(args, "promote")


def rollback_command(args: argparse.Namespace) -> int:
    return _move_production(args, "rollback")


def _move_production(args: argparse.Namespace, action: str) -> int:
    store = Profile.from_environment().store()
    require_model(args, store)
    entry = move_alias(store, args.model, action, resolve_actor(store), version=getattr(args, "version", None),
                       note=args.note)
    before = "none" if entry["from"] is None else f"v{entry['from']}"
    report_observation(args.model, f"{action.capitalize()}: production {before} -> v{entry['to']} by {entry['by']}", {
        "kind": action, "production_version": entry["to"], "previous_production_version": before,
        "by": entry["by"], **identity_metadata(entry), "store_commit": entry["commit_id"]})
    print(f"{args.model}: production {before} -> v{entry['to']} ({action} by {describe_entry(entry)} at "
          f"{entry['at']}, store commit {entry['commit_id'][:12]}).")
    return 0
