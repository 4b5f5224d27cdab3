"""The raw suite over a source read in chunks: the verdicts ``run_suite`` gives on the whole frame,
in memory bounded by the chunk instead of the source.

Each expectation goes where its verdict can be computed:

- **per chunk**: map expectations whose condition looks at one row at a time (not null, in set,
  between, regex, type ...) and schema checks (columns present, column count) run on every
  chunk's ``rows``, ``features`` and ``targets`` (a multi-label table's 0/1 cells) tables.
  Map counts are summed over chunks and ``mostly`` applied to the sums, as Great Expectations
  does on one frame; a schema check must pass on every chunk.
- **once, on a key table**: every other expectation on ``rows`` (row counts, uniqueness,
  aggregates such as a column's mean) runs at the end on a table with one row per source row
  that holds only the columns those expectations name (ids, labels: tens of bytes a row).
  Compound uniqueness over many columns (e.g. all features) runs as uniqueness of a 64-bit hash
  of those columns per row, which holds the same rows as duplicates barring a hash collision.
- ``classes`` has one row per label: it is built from counts at the end and validated whole
  (classification: rows per class; multi-label: positive rows per label column; regression: empty).

Whole-table expectations on ``features`` or ``targets`` (one row per cell) are refused with a
message: they would need every cell of the source at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from assets.quality.placement import placement
from assets.quality.runner import ExpectationOutcome, QualityReport, SuiteRunner, check_suite
from assets.quality.tables import (
    chunk_tables,
    classes_table,
    label_counts,
    positive_counts,
    positives_table,
)

RAW_TABLES = ("rows", "features", "targets", "classes")
_CELL_TABLES = ("features", "targets")  # one row per cell of a chunk
def _named_columns(expectation: Any) -> list[str]:
    cols = [getattr(expectation, a, None) for a in ("column", "column_A", "column_B")]
    return [str(c) for c in cols if c is not None] + [str(c) for c in getattr(expectation, "column_list", None) or []]


@dataclass
class _Merged:
    """One per-chunk expectation's results summed over the chunks seen so far."""

    expectation: Any
    kind: str
    outcome: ExpectationOutcome | None = None
    total: int = 0
    nonnull: int = 0
    unexpected: int | None = None
    columns: set[str] = field(default_factory=set)

    def add(self, outcome: ExpectationOutcome, result: dict) -> None:
        if self.outcome is None:
            self.outcome = outcome
        if self.kind == "schema":
            if self.outcome.success and not outcome.success:
                self.outcome = outcome  # report the first chunk that broke it
            return
        self.outcome.success = self.outcome.success and outcome.error is None
        self.outcome.error = self.outcome.error or outcome.error
        total = int(result.get("element_count") or 0)
        self.total += total
        self.nonnull += total - int(result.get("missing_count") or 0)
        if outcome.unexpected_count is not None:
            self.unexpected = (self.unexpected or 0) + int(outcome.unexpected_count)
            if outcome is not self.outcome:
                self.outcome.examples = (self.outcome.examples + outcome.examples)[:5]
        self.columns.update(outcome.columns)

    def result(self) -> ExpectationOutcome:
        out = self.outcome
        if self.kind == "map" and out.error is None:
            # GE's rule for map expectations (expectation.py, ColumnMapExpectation._validate)
            mostly = getattr(self.expectation, "mostly", None)
            mostly = 1.0 if mostly is None else float(mostly)
            vacuous = self.unexpected is None or self.total == 0 or self.nonnull == 0
            out.success = vacuous or (self.nonnull - self.unexpected) / self.nonnull >= mostly
            out.unexpected_count = self.unexpected
            out.columns = sorted(self.columns)
        return out


class ChunkedRawSuite:
    """Feed it the source chunk by chunk as parsed (``add``); ``finish`` gives the report.

    ``task`` says what ``classes`` counts: rows per value of ``label_column`` (classification),
    positive rows per column of ``label_columns`` (multilabel, whose cells also fill ``targets``),
    or nothing (regression: counting distinct numbers would keep one entry per row)."""

    def __init__(self, asset: str, suite: Mapping[str, Sequence[Any]], feature_columns: Sequence[str],
                 label_column: str, *, task: str = "classification", label_columns: Sequence[str] = ()):
        check_suite(asset, suite, RAW_TABLES)
        self.asset, self.feature_columns, self.label_column = asset, tuple(feature_columns), label_column
        self.task, self.label_columns = task, tuple(label_columns) if task == "multilabel" else ()
        self.runner = SuiteRunner(asset)
        self.rows = 0
        self.counts = pd.Series(dtype="int64")
        self._order: list[tuple[str, int]] = []  # (table, index) in the suite's order
        self._per_chunk: dict[str, list[tuple[int, _Merged]]] = {"rows": [], "features": [], "targets": []}
        self._whole: list[tuple[int, Any, Any]] = []  # (index, as written, as run)
        self._classes = list(suite.get("classes") or ())
        self._key_columns: list[str] = []
        self._hashes: dict[str, list[str]] = {}  # hash column -> the columns it stands for
        for table in RAW_TABLES:
            for i, e in enumerate(suite.get(table) or ()):
                self._order.append((table, i))
                if table == "classes":
                    continue
                where = placement(e)
                if where != "whole":
                    self._per_chunk[table].append((i, _Merged(e, where)))
                elif table in _CELL_TABLES:
                    raise ValueError(
                        f"the raw suite for {asset}: {e.expectation_type} on table {table!r} needs every cell of "
                        "the source at once, and the source is read in chunks; use a per-row expectation "
                        "(e.g. expect_column_values_to_be_between) or put it on a column of 'rows'")
                else:
                    self._whole.append((i, e, self._key_expectation(e)))
        self._keys: dict[str, list] = {c: [] for c in self._key_columns}
        self._absent: set[str] = set()

    def _key_expectation(self, e: Any) -> Any:
        """The expectation to run on the key table; compound uniqueness becomes a hash's uniqueness."""
        if e.expectation_type == "expect_compound_columns_to_be_unique":
            import great_expectations as gx

            name = f"row hash of {len(e.column_list)} columns #{len(self._hashes)}"
            self._hashes[name] = list(e.column_list)
            self._key_columns.append(name)
            return gx.expectations.ExpectColumnValuesToBeUnique(column=name, mostly=e.mostly)
        self._key_columns += [c for c in _named_columns(e) if c not in self._key_columns]
        return e

    def add(self, chunk: pd.DataFrame) -> None:
        self.take(self.observe(chunk))

    def observe(self, chunk: pd.DataFrame) -> dict:
        """What ``add`` learns of one chunk, before it is added to the sums: each per-chunk
        expectation's outcome (with its element and missing counts), the chunk's key columns (None
        for one the chunk lacks), its class counts and rows. Plain data (it pickles), so a step that
        reads some of the source's files can hand its chunks' observations to a step that adds them
        all, in the source's order, with ``take``: the verdicts are then those of one pass
        (assets/table_ingest_steps.py)."""
        tables = chunk_tables(self.feature_columns, chunk, self.label_columns)
        outcomes = {}
        for table, merged in self._per_chunk.items():
            if merged:
                results = self.runner.validate(table, [m.expectation for _, m in merged], tables[table])
                outcomes[table] = [(outcome, {"element_count": result.get("element_count"),
                                              "missing_count": result.get("missing_count")})
                                   for outcome, result in results]
        keys = {}
        for name in self._key_columns:
            cols = self._hashes.get(name, [name])
            if not set(cols) <= set(chunk.columns):
                keys[name] = None  # the check then fails on the key table as on the whole frame
            else:
                keys[name] = (pd.util.hash_pandas_object(chunk[cols], index=False).to_numpy(np.uint64)
                              if name in self._hashes else chunk[name].to_numpy())
        counts = None
        if self.task == "multilabel":
            counts = positive_counts(self.label_columns, chunk)
        elif self.task != "regression":
            counts = label_counts(self.label_column, chunk)
        return {"outcomes": outcomes, "keys": keys, "counts": counts, "rows": len(chunk)}

    def take(self, seen: dict) -> None:
        """Add one chunk's ``observe``: as ``add`` of that chunk would, here."""
        for table, merged in self._per_chunk.items():
            for (_, m), (outcome, result) in zip(merged, seen["outcomes"].get(table, ())):
                m.add(outcome, result)
        for name, values in seen["keys"].items():
            if values is None:
                self._absent.add(name)
            elif name not in self._absent:
                self._keys[name].append(values)
        if seen["counts"] is not None:
            self.counts = self.counts.add(seen["counts"], fill_value=0).astype("int64")
        self.rows += seen["rows"]

    def key_table(self) -> pd.DataFrame:
        """One row per source row, with only the columns the whole-table expectations name."""
        frame = pd.DataFrame(index=pd.RangeIndex(self.rows))
        for name, parts in self._keys.items():
            if name not in self._absent:
                frame[name] = np.concatenate(parts) if parts else np.array([], dtype=object)
        return frame

    def classes_table(self) -> pd.DataFrame:
        """The ``classes`` table of all chunks seen (see ``tables.raw_tables``)."""
        if self.task == "multilabel":
            return positives_table(self.counts, self.rows, self.label_columns)
        return classes_table(self.counts, self.rows)

    def state(self) -> dict:
        """What ``resume`` needs to go on with more rows as if they followed these (JSON): the row
        count, the class counts in their order, each map expectation's sums and the key columns
        missing from the source. The key table itself is ``key_table()``, kept beside it."""
        return {"rows": self.rows, "counts": [[str(k), int(v)] for k, v in self.counts.items()],
                "absent": sorted(self._absent),
                "map": {f"{table}/{i}": [m.total, m.nonnull, m.unexpected]
                        for table, merged in self._per_chunk.items() for i, m in merged if m.kind == "map"}}

    def resume(self, state: dict, keys: pd.DataFrame) -> None:
        """Continue from a published version's ``state`` and key table: the verdicts ``finish`` then
        gives are those of one pass over its rows and the rows added since, provided that every
        chunk added is one such a pass would make (its rows and dtypes: assets/ingest.py proves
        that) and that the version passed, so every schema check held on its chunks (a schema
        check has no sums; it must hold on each chunk)."""
        if self.rows:
            raise ValueError("resume a suite before adding chunks to it")
        self.rows = int(state["rows"])
        self.counts = pd.Series({k: v for k, v in state["counts"]}, dtype="int64")
        self._absent = set(state["absent"])
        for table, merged in self._per_chunk.items():
            for i, m in merged:
                if m.kind == "map":
                    m.total, m.nonnull, m.unexpected = state["map"][f"{table}/{i}"]
        for name in self._key_columns:
            if name not in self._absent:
                self._keys[name] = [keys[name].to_numpy()]

    def finish(self) -> QualityReport:
        done: dict[tuple[str, int], ExpectationOutcome] = {}
        for table, merged in self._per_chunk.items():
            for i, m in merged:
                if m.outcome is None:  # no chunk at all: validate an empty table like the whole-frame run
                    for outcome, result in self.runner.validate(table, [m.expectation], pd.DataFrame()):
                        m.add(outcome, result)
                done[(table, i)] = m.result()
        if self._whole:
            results = self.runner.validate("rows", [k for _, _, k in self._whole], self.key_table())
            for (i, e, k), (outcome, _) in zip(self._whole, results):
                if k is not e:  # name the check as the suite wrote it; hash values are no examples
                    outcome.expectation, outcome.examples = e.expectation_type, []
                    outcome.kwargs = {"column_list": list(e.column_list), "mostly": e.mostly}
                done[("rows", i)] = outcome
        if self._classes:
            results = self.runner.validate("classes", self._classes, self.classes_table())
            for i, (outcome, _) in enumerate(results):
                done[("classes", i)] = outcome
        return QualityReport(asset=self.asset, outcomes=[done[k] for k in self._order])
