"""The commands that read the registry: ``lineage``, ``versions``, ``compare`` and ``diff``."""

from __future__ import annotations

import argparse
import json

from core.lineage import commit_ids
from core.registry import PRODUCTION, list_comments, list_versions, read_alias, read_lineage
from pipelines.cli.compare import data_diff_rows
from pipelines.cli.errors import UsageError
from pipelines.cli.lookup import require_dataset, require_model
from pipelines.cli.render import format_compare, format_dataset_versions, format_diff, format_lineage, format_versions
from pipelines.profiles import Profile
from resources.store.base import RefNotFoundError, VersionedStore


def lineage_command(args: argparse.Namespace) -> int:
    profile = Profile.from_environment()
    require_model(args, profile.store())
    return print_lineage(profile, args.model, args.version, args.json)


def print_lineage(profile: Profile, model: str, version: int | None, as_json: bool) -> int:
    store = profile.store()
    record = read_lineage(store, model, version)
    alias = read_alias(store, model)
    comments = list_comments(store, model, record["version"])
    if as_json:
        annotated = {**record, "annotations": {"comments": comments, PRODUCTION: alias}}
        print(json.dumps(annotated, indent=2, sort_keys=True))
        return 0
    resolved = {name: _resolves(store, cid) for name, cid in commit_ids(record).items()}
    print(format_lineage(record, resolved, production=alias, comments=comments))
    return 0


def _resolves(store: VersionedStore, commit_id: str) -> str | None:
    try:
        return store.resolve_ref(commit_id)
    except RefNotFoundError:
        return None  # the record points at a commit the store no longer has: the text says so


def versions_command(args: argparse.Namespace) -> int:
    store = Profile.from_environment().store()
    require_model(args, store)
    versions = list_versions(store, args.model)
    if not versions:
        read_lineage(store, args.model)  # raises the one-line "no registered versions" error
    records = [read_lineage(store, args.model, v) for v in versions]
    comment_counts = [len(list_comments(store, args.model, v)) for v in versions]
    print(format_versions(records, read_alias(store, args.model), comment_counts))
    return 0


def compare_command(args: argparse.Namespace) -> int:
    if len(args.versions) < 2:
        raise UsageError("compare needs at least two versions, e.g. `compare digits 1 2`")
    store = Profile.from_environment().store()
    require_model(args, store)
    records = [read_lineage(store, args.model, v) for v in args.versions]
    print(format_compare(records, only_differences=args.only_differences))
    return 0


def diff_command(args: argparse.Namespace) -> int:
    store = Profile.from_environment().store()
    require_model(args, store)
    left, right = read_lineage(store, args.model, args.v1), read_lineage(store, args.model, args.v2)
    print(format_diff(left, right, data_diff_rows(store, left, right)))
    return 0


def datasets_command(args: argparse.Namespace) -> int:
    """Published versions of a dataset, or every dataset that has some."""
    from core.datasets import UnknownDatasetVersionError, list_dataset_versions, published_datasets

    store = Profile.from_environment().store()
    if args.dataset is None:
        names = published_datasets(store)
        print("\n".join(names) if names else "no dataset has a published version yet")
        return 0
    try:
        versions = list_dataset_versions(store, args.dataset)
    except UnknownDatasetVersionError:
        require_dataset(args, args.dataset, published=False)  # an unknown name: where was it looked for
        raise
    require_dataset(args, args.dataset, published=bool(versions))
    if args.json:
        print(json.dumps([v.to_dict() for v in versions], indent=2, sort_keys=True))
    else:
        print(format_dataset_versions(args.dataset, versions))
    return 0
