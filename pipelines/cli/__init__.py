"""``python -m pipelines``: run the demo and question model versions from the command line.

``parser`` declares the commands; ``inspection``, ``annotation``, ``reproduce``, ``tensorboard`` and
``demo`` run them; ``render`` writes their text, ``compare`` finds what differs between versions,
``instance`` reports to the Dagster instance, ``lookup`` finds a named pipeline in the workspace's
code locations and ``sources`` commits source files.
"""

from __future__ import annotations

import sys

from core.datasets import UnknownDatasetVersionError
from core.registry import AliasError, UnknownModelVersionError
from pipelines.cli.errors import ReproductionError, UsageError
from pipelines.cli.parser import build_parser
from resources.store.base import StoreError

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run one command; a known failure is one line on stderr: exit status 2 for a wrong request, 1 otherwise."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UnknownModelVersionError, UnknownDatasetVersionError, AliasError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ReproductionError, StoreError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
