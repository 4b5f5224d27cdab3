"""The command line: every command, its arguments and its help text."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.cli.annotation import comment_command, promote_command, rollback_command
from pipelines.cli.demo import DEMO_HELP, demo_command
from pipelines.cli.experiments import sweeps_command, train_command
from pipelines.cli.export import export_command
from pipelines.cli.inspection import (
    compare_command,
    datasets_command,
    diff_command,
    lineage_command,
    versions_command,
)
from pipelines.cli.platform_care import (
    DEFAULT_DEFS_DIR,
    housekeeping_command,
    scaffold_command,
    workspace_command,
)
from pipelines.cli.predict import predict_command
from pipelines.cli.reproduce import reproduce_command
from pipelines.cli.sources import sources_add_command, sources_examples_command
from pipelines.cli.store_log import log_command
from pipelines.cli.tensorboard import DEFAULT_PORT, port_number, tensorboard_command


def version_number(text: str) -> int:
    """``3`` or ``v3``."""
    digits = text[1:] if text[:1] in ("v", "V") else text
    if not digits.isdigit() or int(digits) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version number; write e.g. 3 or v3")
    return int(digits)


# The identity recorded is the one the platform verifies (core/identity.py); what --by says is a note.
NOTE_HELP = ("A note shown beside your identity, e.g. on whose behalf. It is not the identity: the record names "
             "the lakeFS user behind the store's credentials, else your OS user marked as not authenticated.")


def location_args(p: argparse.ArgumentParser) -> None:
    """Where a command looks for the pipeline it names (pipelines/cli/lookup.py)."""
    p.add_argument("--location", default=None,
                   help="The code location that defines the pipeline (default: whichever location of the "
                        "workspace does).")
    p.add_argument("--workspace", type=Path, default=None,
                   help="The workspace file listing the code locations (default: workspace.yaml in the current "
                        "directory, else the repository's).")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines",
        description="Run the demo and question model versions: their lineage, differences, reproduction, "
                    "comments and the production alias; predict with a version; see versions' training curves in "
                    "TensorBoard; list dataset versions; commit source files; check the "
                    "workspace; clean the store. The platform is the one at DAGSTER_HOME; a pipeline is found in "
                    "any code location of workspace.yaml.")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, func) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        return p

    def model_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="Model name, e.g. digits.")
        location_args(p)

    command("demo", DEMO_HELP, demo_command)

    p = command("train", "Train a model (its sweep, if it declares one) in this process, with its pipeline's settings changed for this run "
                         "only (recorded in the lineage as overrides; the run is tagged platform/overrides), then "
                         "print the new version's lineage.", train_command)
    model_arg(p)
    p.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                   help="Override one setting, e.g. train.lr=0.005, train.seed=1, model.hidden_sizes=[64], "
                        "gate.test_accuracy.min=0.8, guards.hang_timeout_s=120 (values are read as JSON). "
                        "Repeatable.")
    p.add_argument("--no-sweep", action="store_true", help="Train the recipe once instead of the pipeline's sweep.")

    p = command("sweeps", "List a model's sweeps and their trials (parameters, objective, pruned step); "
                          "--compare shows trials side by side.", sweeps_command)
    model_arg(p)
    p.add_argument("--study", default=None, help="Only this sweep (its study name, as listed).")
    p.add_argument("--compare", nargs="+", type=int, metavar="TRIAL",
                   help="Trial numbers to show side by side (of the newest sweep, or --study's).")
    p.add_argument("--json", action="store_true", help="Print the sweeps and trials as JSON.")

    p = command("lineage", "Print a model version's lineage record, its comments and the production alias.",
                lineage_command)
    model_arg(p)
    p.add_argument("--version", type=version_number, default=None, help="Version number (default: the newest).")
    p.add_argument("--json", action="store_true", help="Print the record as JSON (comments and alias under 'annotations').")

    p = command("versions", "List a model's versions with test accuracy (or the task's own test metric), data commit "
                            "and the production alias.",
                versions_command)
    model_arg(p)

    p = command("compare", "Show parameters, metrics and data commits of versions side by side; '*' marks differences.",
                compare_command)
    model_arg(p)
    p.add_argument("versions", nargs="+", type=version_number, metavar="VERSION", help="Two or more versions, e.g. 1 2.")
    p.add_argument("--only-differences", action="store_true", help="Leave out fields that are the same everywhere.")

    p = command("diff", "Objects added, removed and changed between two versions' dataset commits, "
                        "plus their parameter and metric differences.", diff_command)
    model_arg(p)
    p.add_argument("v1", type=version_number, help="The older version.")
    p.add_argument("v2", type=version_number, help="The newer version.")

    p = command("reproduce", "Re-run a version's training from its lineage record alone (same shards commit, config "
                             "and seed, torchrun on this machine) and compare the figures with the original.",
                reproduce_command)
    model_arg(p)
    p.add_argument("version", type=version_number, help="The version to reproduce.")
    p.add_argument("--tolerance", type=float, default=1e-6,
                   help="Largest absolute difference of a figure counted as reproduced (default 1e-6).")
    p.add_argument("--work-dir", default=None, help="Where to train (default: <data root>/reproductions/...).")
    p.add_argument("--exact", action="store_true",
                   help="Also require bit-identical weights (the same sha256): what the same machine and code give "
                        "on CPU (docs/questioning-versions.md says when).")

    p = command("predict", "Load a registered model version and predict on INPUT: a CSV file of feature rows (table "
                           "models), an image file (image models) or a text prompt (text models; a language model "
                           "continues it).", predict_command)
    model_arg(p)
    p.add_argument("input", metavar="INPUT", help="CSV file, image file or text prompt.")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--version", type=version_number, default=None, help="Version number (default: the newest).")
    which.add_argument("--alias", default=None, help="Use the version an alias points at, e.g. production.")
    p.add_argument("--max-new-tokens", type=int, default=40, help="Tokens a language model adds (default 40).")
    p.add_argument("--seed", type=int, default=0, help="Sampling seed of a language model (default 0).")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="Sampling temperature of a language model (default 1.0).")
    p.add_argument("--top-k", type=int, default=None, help="Sample among the k likeliest tokens (default: all).")
    p.add_argument("--json", action="store_true", help="Print the predictions as JSON.")

    p = command("export", "Write a version's self-contained folder into DIR for deployment: weights, card, tokenizer, "
                          "ONNX, lineage.json and a README on loading it with safetensors or onnxruntime (copied "
                          "byte for byte, sha256 checked).", export_command)
    model_arg(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--version", type=version_number, default=None, help="Version number (default: the newest).")
    which.add_argument("--alias", default=None, help="Export the version an alias points at, e.g. production.")
    p.add_argument("dir", metavar="DIR", help="Where to write it: a new or empty folder.")

    p = command("tensorboard", "Show a model's versions side by side in TensorBoard: copy each version's event files "
                               "from the artifact store into a log directory (one run per version, v1, v2, ...) and "
                               "serve it.", tensorboard_command)
    model_arg(p)
    p.add_argument("--versions", nargs="+", type=version_number, default=None, metavar="VERSION",
                   help="Only these versions, e.g. 1 3 (default: all).")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"Port to serve on (default {DEFAULT_PORT}).")
    p.add_argument("--host", default="127.0.0.1", help="Address to serve on (default 127.0.0.1; 0.0.0.0 for all).")
    p.add_argument("--logdir", default=None,
                   help="Where to put the event files (default: <data root>/tensorboard/<model>).")
    p.add_argument("--no-serve", "--logdir-only", dest="no_serve", action="store_true",
                   help="Only prepare the log directory and print where it is.")

    p = command("comment", "Record a note on a version: in the store, in `lineage` and in the asset's history in "
                           "the Dagster UI.", comment_command)
    model_arg(p)
    p.add_argument("version", type=version_number, help="The version the note is about.")
    p.add_argument("text", help="The note.")
    p.add_argument("--by", "--author", dest="note", default=None, help=NOTE_HELP)

    p = command("promote", "Point the production alias at a version (audited).", promote_command)
    model_arg(p)
    p.add_argument("version", type=version_number, help="The version to put in production.")
    p.add_argument("--by", dest="note", default=None, help=NOTE_HELP)

    p = command("rollback", "Return the production alias to the version it pointed at before (audited).",
                rollback_command)
    model_arg(p)
    p.add_argument("--by", dest="note", default=None, help=NOTE_HELP)

    p = command("datasets", "List a dataset's published versions (<dataset>-d<N>) with sample counts, data checks "
                            "and the model versions trained on each; without a name, the datasets.", datasets_command)
    p.add_argument("dataset", nargs="?", default=None, help="Dataset name, e.g. digits.")
    p.add_argument("--json", action="store_true", help="Print the versions as JSON.")
    location_args(p)

    p = command("log", "Print a branch's commit log in the versioned store, newest first: date, message, the version "
                       "tags on each commit and the Dagster run that made it (what reached main, and what did not).",
                log_command)
    p.add_argument("--branch", default="main", help="The branch (or tag, or commit id) to start from (default: main).")
    p.add_argument("-n", type=int, default=20, help="How many commits to show (default 20).")
    p.add_argument("--first-parent", action="store_true",
                   help="Follow only each merge's first parent: the commits the branch's head has been.")
    p.add_argument("--json", action="store_true", help="Print the commits as JSON, with their parents and metadata.")

    what = ("Source files of dataset pipelines: commit new ones to the store's sources area (`add`), or write the "
            "example pipelines' data (`examples`).")
    p = sub.add_parser("sources", help=what, description=what)
    sources = p.add_subparsers(dest="sources_command", required=True)
    q = sources.add_parser("add", help="Commit files to main under the store's sources/ area, where the dataset's "
                                       "pipeline reads them and its new-data sensor sees them (local store or lakeFS).",
                           description="Commit files to main under the store's sources/ area, beside the files the "
                                       "dataset's pipeline reads (a folder: every file in it, keeping its sub-folders, "
                                       "e.g. one per image class). Its new-data sensor then starts a run.")
    q.set_defaults(func=sources_add_command)
    q.add_argument("dataset", help="The pipeline that reads the sources, e.g. digits.")
    q.add_argument("files", nargs="+", metavar="FILE", help="Files or folders to commit.")
    q.add_argument("--to", default=None, metavar="PATH",
                   help="Store path under sources/ for a single file, e.g. digits/digits.csv to replace that file.")
    location_args(q)
    q = sources.add_parser("examples", help="Write the example pipelines' data (digits CSV, shapes images, pydoc "
                                            "text) under DAGSTER_HOME/platform/sources; make demo does it too.",
                           description="Write the example pipelines' data (digits CSV, shapes images, pydoc text) "
                                       "under the local sources folder, DAGSTER_HOME/platform/sources; existing "
                                       "files are kept.")
    q.set_defaults(func=sources_examples_command)

    p = command("housekeeping", "List what store housekeeping would delete (merged or old run branches, checkpoints "
                                "of runs never registered, old reproductions) with the reasons; --apply deletes. "
                                "Never what a model version's lineage points at.", housekeeping_command)
    p.add_argument("--older-than-days", type=float, default=7.0,
                   help="Only what has been untouched for longer than this (default 7).")
    p.add_argument("--apply", action="store_true", help="Delete the items listed (default: a dry run); recorded "
                                                         "in the audit trail with your verified identity.")
    p.add_argument("--by", dest="note", default=None, help=NOTE_HELP)
    p.add_argument("--history", action="store_true", help="List the recorded applies (who, when, what) instead.")

    p = command("workspace", "Load every code location of a workspace and check that pipeline and dataset names are "
                             "unique across them and shared datasets are published where they are read from.",
                workspace_command)
    p.add_argument("--workspace", type=Path, default=None,
                   help="The workspace file (default: workspace.yaml in the current directory, else the "
                        "repository's, as for every other command).")

    p = command("scaffold", "Write a new YAML building block (a dataset, a training on a dataset, or a whole "
                            "pipeline) from its template, every field listed.", scaffold_command)
    p.add_argument("kind", choices=["dataset", "training", "pipeline"], help="The kind of block.")
    p.add_argument("name", help="The block's pipeline name: lowercase letters, digits and '_'.")
    p.add_argument("--defs-dir", type=Path, default=DEFAULT_DEFS_DIR,
                   help="The defs folder of the code location (default: pipelines/defs).")
    return parser
