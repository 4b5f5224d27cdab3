"""Run a suite of Great Expectations 1.x expectations on named pandas tables, in an ephemeral context.

A suite is ``{table name: [Expectation, ...]}``; the tables come from ``assets.quality.tables``.
The report is what the asset check shows, what the store commit carries (``check_results``) and
what the lineage record keeps.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd


@dataclass
class ExpectationOutcome:
    table: str
    expectation: str
    kwargs: dict[str, Any]
    success: bool
    observed: Any = None
    unexpected_count: int | None = None
    examples: list[Any] = field(default_factory=list)
    error: str | None = None
    columns: list[str] = field(default_factory=list)  # source columns of unexpected cells (long tables)

    def summary(self) -> str:
        target = self.kwargs.get("column") or self.kwargs.get("column_list") or self.kwargs.get("column_set") or ""
        if isinstance(target, list):
            target = ",".join(map(str, target[:4])) + ("..." if len(target) > 4 else "")
        what = f"{self.table}: {self.expectation}({target})"
        if self.columns:
            what += " in " + ", ".join(self.columns[:5]) + (" ..." if len(self.columns) > 5 else "")
        if self.error:
            return f"{what} could not run: {self.error}"
        bits = []
        if self.unexpected_count:
            bits.append(f"{self.unexpected_count} unexpected" + (f", e.g. {self.examples[:3]}" if self.examples else ""))
        if self.observed is not None and not self.unexpected_count:
            bits.append(f"observed {_short(self.observed)}")
        return what + (f" ({'; '.join(bits)})" if bits else "")


@dataclass
class QualityReport:
    """The outcome of one suite on one asset's data."""

    asset: str
    outcomes: list[ExpectationOutcome]
    extra_failures: list[str] = field(default_factory=list)  # rules outside GE (e.g. type coercion)

    @property
    def passed(self) -> bool:
        return all(o.success for o in self.outcomes) and not self.extra_failures

    @property
    def failures(self) -> list[str]:
        # Rules outside GE first: they say in plain words what the expectations found.
        return list(self.extra_failures) + [o.summary() for o in self.outcomes if not o.success]

    def with_failure(self, message: str | None) -> "QualityReport":
        return self if not message else QualityReport(self.asset, self.outcomes, [*self.extra_failures, message])

    def summary(self) -> dict[str, Any]:
        """Small enough for commit metadata and the lineage record."""
        return {"asset": self.asset, "passed": self.passed, "evaluated": len(self.outcomes),
                "failed": len(self.failures), "failures": self.failures[:20], "engine": _engine()}

    def to_json(self) -> bytes:
        """The full validation report committed on the run branch."""
        body = {**self.summary(), "failures": self.failures,
                "results": [vars(o) for o in self.outcomes]}
        return json.dumps(body, indent=2, sort_keys=True, default=str).encode()


def _engine() -> str:
    from importlib.metadata import version

    return f"great_expectations {version('great_expectations')}"


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _skip_batch_fingerprints() -> None:
    """GE fingerprints every in-memory batch under 1 GB (md5 over ``hash_pandas_object`` of all
    cells, twice per validation) for a ``batch_markers`` entry nothing here reads. Skipping it
    took the raw suite on a 27 MB source from 1.47-1.59 s to 1.01-1.26 s. The threshold is GE's
    own switch for large frames; setting it to 0 marks every batch as too large to fingerprint."""
    from great_expectations.execution_engine import pandas_execution_engine

    if hasattr(pandas_execution_engine, "HASH_THRESHOLD"):
        pandas_execution_engine.HASH_THRESHOLD = 0


def _context():
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    _skip_batch_fingerprints()
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    return context


class SuiteRunner:
    """One ephemeral Great Expectations context that validates many frames: one call per table of
    a whole-frame suite, or one per table and chunk when the source is read in chunks."""

    def __init__(self, asset: str):
        self.asset = asset
        self._context = _context()
        self._source = self._context.data_sources.add_pandas(f"{asset}_source")
        self._batches: dict[str, Any] = {}
        self._suites: dict[tuple, Any] = {}  # an expectation belongs to one GE suite: reuse it per chunk

    def validate(self, table: str, expectations: Sequence[Any], frame: pd.DataFrame) -> list[tuple[ExpectationOutcome, dict]]:
        """(outcome, GE's raw result dict) per expectation, in the given order."""
        import great_expectations as gx

        if table not in self._batches:
            self._batches[table] = self._source.add_dataframe_asset(table).add_batch_definition_whole_dataframe("whole")
        batch = self._batches[table].get_batch(batch_parameters={"dataframe": frame})
        key = (table, *map(id, expectations))
        if key not in self._suites:
            # validated as it is, not added to the context: adding one saves the context's whole
            # configuration as YAML (7 saves, 0.05 s of the raw suite on a 27 MB source)
            self._suites[key] = gx.ExpectationSuite(
                name=f"{self.asset}.{table}.{len(self._suites)}", expectations=list(expectations))
        gx_suite = self._suites[key]
        result = batch.validate(gx_suite, result_format=_result_format(frame))
        return [(_outcome(table, r), r.result or {}) for r in result.results]


def _outcome(table: str, r: Any) -> ExpectationOutcome:
    res = r.result or {}
    exc = r.exception_info or {}
    error = exc.get("exception_message") if exc.get("raised_exception") else None
    return ExpectationOutcome(
        table=table, expectation=r.expectation_config.type,
        kwargs={k: v for k, v in r.expectation_config.kwargs.items() if k not in ("batch_id",)},
        success=bool(r.success), observed=_plain(res.get("observed_value")),
        unexpected_count=res.get("unexpected_count"),
        examples=[_plain(v) for v in (res.get("partial_unexpected_list") or [])[:5]], error=error,
        columns=sorted({str(i["column"]) for i in res.get("partial_unexpected_index_list") or []
                        if isinstance(i, dict) and "column" in i}))


def check_suite(asset: str, suite: Mapping[str, Sequence[Any]], tables: Sequence[str]) -> None:
    """Refuse an empty suite (an error, not a pass) and tables the asset does not have."""
    if not suite or not any(suite.values()):
        raise ValueError(f"the expectation suite for {asset} is empty; give at least one expectation")
    unknown = sorted(set(suite) - set(tables))
    if unknown:
        raise ValueError(f"the expectation suite for {asset} names table(s) {unknown}; "
                         f"the tables are {sorted(tables)}")


def run_suite(asset: str, suite: Mapping[str, Sequence[Any]], tables: Mapping[str, pd.DataFrame]) -> QualityReport:
    """Validate each table with its expectations."""
    check_suite(asset, suite, list(tables))
    runner = SuiteRunner(asset)
    outcomes: list[ExpectationOutcome] = []
    for table, expectations in suite.items():
        if expectations:
            outcomes += [o for o, _ in runner.validate(table, expectations, tables[table])]
    return QualityReport(asset=asset, outcomes=outcomes)


def _result_format(frame: pd.DataFrame) -> dict:
    fmt: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": 20}
    if "column" in frame.columns:  # long tables: report which source column a bad cell came from
        fmt["unexpected_index_column_names"] = ["column"]
    return fmt


def _plain(value: Any) -> Any:
    """JSON-friendly numbers and strings (numpy scalars, NaN)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            value = str(value)
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value[:20]]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value if not isinstance(value, str) or len(value) <= 200 else value[:200] + "..."
    return str(value)[:200]
