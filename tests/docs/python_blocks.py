"""Python blocks: run in the page's namespace (or imported, for an excerpt), and every pipeline they
declare is built into Dagster Definitions with all of its jobs, as a code location would load it."""

from __future__ import annotations

import doctest
import io
import types
from pathlib import Path

import dagster as dg
from sybil import Example
from sybil.evaluators.python import pad

from core.spec import PipelineSpec


DOCTEST_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def run_block(example: Example, data_root: Path) -> None:
    """Run the block as Sybil's Python evaluator does, with the page's line numbers in a traceback
    (a block starting with ``>>>`` as a doctest), then build what it declared."""
    before = {id(v) for v in example.namespace.values()}
    block = example.parsed
    if block.source.lstrip().startswith(">>>"):
        run_doctest(block.source, example.namespace, example.path, block.line)
    else:
        # The source starts on the line after the opening fence.
        exec(compile(pad(block.source, block.line), example.path, "exec", dont_inherit=True), example.namespace)
    new = [v for v in example.namespace.values() if isinstance(v, PipelineSpec) and id(v) not in before]
    build_pipelines(new, data_root)


def run_doctest(source: str, namespace: dict, path: str, line: int) -> None:
    """The doctest in ``source`` (at page line ``line``), in ``namespace``; '...' matches any text."""
    test = doctest.DocTestParser().get_doctest(source, namespace, f"{path}:{line}", path, line)
    runner = doctest.DocTestRunner(optionflags=DOCTEST_FLAGS)
    report = io.StringIO()
    runner.run(test, out=report.write, clear_globs=False)
    namespace.update(test.globs)  # DocTest ran in a copy; later blocks of the page see its names
    if runner.failures:
        raise AssertionError(f"the doctest's output differs:\n{report.getvalue()}")


def specs_of(module: types.ModuleType) -> list[PipelineSpec]:
    return [v for v in vars(module).values() if isinstance(v, PipelineSpec)]


def build_pipelines(specs: list[PipelineSpec], data_root: Path) -> None:
    """Definitions of ``specs`` in a code location of their own, on a local profile under ``data_root``;
    every job is resolved, so a mistake the webserver would show fails here. A model that trains on
    a dataset of the platform's location, which the block does not declare, gets that dataset beside it."""
    if not specs:
        return
    from pipelines.assembly import location_definitions
    from pipelines.models import PIPELINES
    from pipelines.profiles import Profile

    names = {s.name for s in specs}
    needed = {s.dataset for s in specs if s.dataset and not s.published_elsewhere and s.dataset not in names}
    owners = [p for p in PIPELINES if p.name in needed]
    if missing := needed - {p.name for p in owners}:
        raise AssertionError(f"the block trains on dataset(s) {sorted(missing)} that neither it nor "
                             "pipelines/models declares")
    defs = location_definitions("docs", [*owners, *specs], Profile(name="local", data_root=data_root))
    dg.Definitions.validate_loadable(defs)
    jobs = defs.get_repository_def().get_all_jobs()
    assert jobs, "the pipelines of the block define no job"
