"""``python -m pipelines``: run the demo and question model versions from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from assets.lineage import commit_ids
from assets.registry import UnknownModelVersionError, read_lineage
from pipelines.profiles import Profile


def _cmd_demo(args: argparse.Namespace) -> int:
    import dagster as dg

    from pipelines.definitions import build_definitions, training_job_name
    from pipelines.models import PIPELINES
    from pipelines.models.digits import digits_pipeline, write_digits_source

    profile = Profile.from_environment()
    write_digits_source(profile.data_root / "sources")
    defs = build_definitions(profile, PIPELINES)
    job = defs.resolve_job_def(training_job_name(digits_pipeline))
    with dg.DagsterInstance.get() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
    if not result.success:
        for event in result.all_events:
            if event.is_failure:
                print(f"FAILED {event.step_key}: {event.event_specific_data.error.message.strip()}", file=sys.stderr)
        return 1
    print(f"Run {result.run_id} succeeded.\n")
    return _print_lineage(profile, digits_pipeline.name, None, as_json=False)


def _cmd_lineage(args: argparse.Namespace) -> int:
    return _print_lineage(Profile.from_environment(), args.model, args.version, args.json)


def _print_lineage(profile: Profile, model: str, version: int | None, as_json: bool) -> int:
    store = profile.store()
    record = read_lineage(store, model, version)
    resolved = {name: store.resolve_ref(cid) for name, cid in commit_ids(record).items()}
    if as_json:
        print(json.dumps(record, indent=2, sort_keys=True))
        return 0
    print(format_lineage(record, resolved))
    return 0


def format_lineage(record: dict, resolved: dict[str, str]) -> str:
    t, ev = record["training"], record["evaluation"]
    lines = [
        f"{record['model']} v{record['version']}  (created {record['created_at']})",
        f"  checkpoint      {record['checkpoint']['uri']}",
        f"  sha256          {record['checkpoint']['sha256']}",
        f"  store           {record['data'].get('backend')} repository {record['data'].get('repository')}",
        f"  raw commit      {record['data']['raw_commit']}  (resolves: {'yes' if resolved.get('raw_commit') else 'no'})",
        f"  shards commit   {record['data']['shards_commit']}  (resolves: {'yes' if resolved.get('shards_commit') else 'no'})",
        f"  weights commit  {record['checkpoint']['commit']}",
        f"  code            git {record['code'].get('git_sha')} dirty={record['code'].get('dirty')}",
        f"  environment     python {record['environment']['python']}, torch {record['environment']['torch']}",
        f"  training        model={t['config'].get('model', {}).get('name')} seed={t['seed']} "
        f"world_size={t['world_size']} backend={t['backend']}",
        f"  figures         final_loss={record['training_figures'].get('final_loss')} "
        f"samples/s={record['training_figures'].get('samples_per_second')}",
        f"  test            accuracy={ev['test']['accuracy']:.4f} loss={ev['test']['loss']:.4f} "
        f"(n={ev['test']['num_samples']})",
        f"  quality gate    {'passed' if record['quality_gate']['passed'] else 'FAILED'}",
        f"  dagster run     {record['dagster']['run_id']}  {record['dagster']['run_url']}",
    ]
    for k, v in record.get("links", {}).items():
        lines.append(f"  lakeFS {k:<9} {v}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="Run the digits pipeline once on this profile and print its lineage.")
    demo.set_defaults(func=_cmd_demo)
    lin = sub.add_parser("lineage", help="Print a model version's lineage record.")
    lin.add_argument("model", help="Model name, e.g. digits.")
    lin.add_argument("--version", type=int, default=None, help="Version number (default: the newest).")
    lin.add_argument("--json", action="store_true", help="Print the record as JSON.")
    lin.set_defaults(func=_cmd_lineage)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UnknownModelVersionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
