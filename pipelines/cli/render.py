"""The CLI's text: aligned tables, lineage, compare, diff, the versions list and reproduction figures."""

from __future__ import annotations

import json
from collections.abc import Mapping

from core.identity import describe_entry
from core.lineage import LineageRow, lineage_heading, lineage_rows
from pipelines.cli.compare import SECTIONS, compare_rows, dataset_prefix

DIFF_MARK = "*"


def format_value(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3e}"
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a commit id or checksum: the prefix is enough to tell them apart
    if isinstance(value, (list, tuple)):
        return json.dumps(value)
    return str(value)


def table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    fmt = lambda cells: indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    rule = [("-" * w) if header[i] else " " * w for i, w in enumerate(widths)]
    return [fmt(header), fmt(rule), *(fmt(r) for r in rows)]


# --- lineage -------------------------------------------------------------------------------------
def format_lineage(record: dict, resolved: Mapping[str, str | None] | None, production: dict | None = None,
                   comments: list[dict] = ()) -> str:
    """The rows the UI shows too (``core.lineage.lineage_rows``), then the production alias and comments."""
    rows = lineage_rows(record, resolved)
    if production is not None:
        rows.append(LineageRow("production", format_production(production, record["version"])))
    if comments:
        rows.append(LineageRow("comments", str(len(comments))))
    lines = [lineage_heading(record), *(f"  {row.field:<15} {_terminal_value(row)}" for row in rows)]
    lines.extend(f"    {c['created_at']}  {describe_entry(c, 'author')}: {c['text']}" for c in comments)
    return "\n".join(lines)


def _terminal_value(row: LineageRow) -> str:
    """A terminal shows no links: the address follows the value, unless it is the value."""
    return row.value if row.url in (None, row.value) else f"{row.value}  {row.url}"


def format_production(alias: dict, version: int) -> str:
    current = alias.get("version")
    if current is None:
        return "no version is in production"
    last = alias["history"][-1]
    how = f"({last['action']} by {describe_entry(last)} at {last['at']})"
    if current == version:
        return f"this version, v{version}, is in production {how}"
    return f"v{current} is in production, not this version {how}"


def format_versions(records: list[dict], production: dict, comment_counts: list[int]) -> str:
    """One line per version, oldest first (``comment_counts`` in the same order as ``records``), then
    who moved the production alias last."""
    production_version = production.get("version")
    figures = [headline(r["evaluation"]["test"], r) for r in records]
    rows = [["production" if production_version == r["version"] else "", f"v{r['version']}", r["created_at"],
             figure, r["data"]["shards_commit"][:12], str(n)]
            for r, figure, n in zip(records, figures, comment_counts, strict=True)]
    header = "test acc" if all(figure[0].isdigit() for figure in figures) else "test metric"
    lines = table(["alias", "version", "created", header, "shards", "comments"], rows, indent="")
    if production.get("history"):
        last = production["history"][-1]
        lines.append(f"production: v{last['to']} since the {last['action']} by {describe_entry(last)} at {last['at']}")
    return "\n".join(lines)


# The one figure a versions listing shows per task: accuracy where there is one, else the task's own.
# (Language models report a next-token accuracy too; their figure is perplexity.)
_HEADLINE = ("perplexity", "accuracy", "r2", "micro_f1")


def headline(test: dict, record: Mapping | None = None) -> str:
    """``0.9711`` for a classifier's accuracy (the column's classic figure), ``perplexity 8.2301`` else."""
    name = headline_metric(test, record or {})
    return f"{test[name]:.4f}" if name == "accuracy" else f"{name} {test[name]:.4f}"


def headline_metric(test: dict, record: Mapping) -> str:
    """The test metric that stands for a version: a built-in task's own; for a team's task, the one
    its quality gate bounds, else the one its training monitored, else its only metric besides the
    loss. The loss only when nothing else says which: a task's metric (``reconstruction_mse``) is
    what its users judge it by, and a bare ``loss`` reads as the built-in classifier's."""
    scalars = {k for k, v in test.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and k != "num_samples"}
    builtin = next((k for k in _HEADLINE if k in scalars), None)
    if builtin is not None:
        return builtin
    gated = [bound[len("test_"):] for bound in ((record.get("quality_gate") or {}).get("bounds") or {})
             if bound.startswith("test_") and bound[len("test_"):] in scalars - {"loss"}]
    if gated:
        return gated[0]
    monitor = (record.get("training_figures") or {}).get("monitor")
    if monitor in scalars - {"loss"}:
        return monitor
    others = sorted(scalars - {"loss"})
    if len(others) == 1:
        return others[0]
    if "loss" in scalars:
        return "loss"
    raise ValueError(f"the version's test figures {sorted(test)} hold no scalar metric to show; its lineage "
                     "record is damaged")


def format_dataset_versions(dataset: str, versions: list) -> str:
    """One line per published version of ``dataset`` (core.datasets.DatasetVersion), oldest first."""
    if not versions:
        return f"{dataset}: no published versions (a version is published when a model trained on it registers)"

    def checks(v) -> str:
        return ", ".join(f"{asset} {'passed' if c.passed else 'FAILED'} ({c.expectations})"
                         for asset, c in v.checks.items()) or "none recorded"

    rows = [[v.tag, v.committed_at, v.commit_id[:12],
             " / ".join(str(v.num_samples.get(s, 0)) for s in ("train", "validation", "test")),
             checks(v), ", ".join(v.models) or "-"] for v in versions]
    return "\n".join(table(["version", "published", "shards", "train / val / test", "checks", "models trained on it"],
                           rows, indent=""))


# --- compare and diff ----------------------------------------------------------------------------
def format_compare(records: list[dict], only_differences: bool = False) -> str:
    rows = compare_rows(records)
    n_diff = sum(1 for r in rows if r[3])
    title = " vs ".join(f"v{r['version']}" for r in records)
    lines = [f"{records[0]['model']}: {title}   ({DIFF_MARK} marks {n_diff} field(s) that differ)"]
    for section, _ in SECTIONS:
        if not any(r[0] == section for r in rows):
            continue  # no version had overrides or a sweep
        body = [[DIFF_MARK if d else "", key, *(format_value(v) for v in vals)]
                for s, key, vals, d in rows if s == section and (d or not only_differences)]
        lines.append("")
        lines.append(f"{section}:")
        if body:
            lines.extend(table(["", "field", *(f"v{r['version']}" for r in records)], body))
        else:
            lines.append("  (no differences)")
    return "\n".join(lines)


def format_diff(left: dict, right: dict, data_rows: list[tuple[str, str, int | None, int | None]]) -> str:
    model, v1, v2 = left["model"], f"v{left['version']}", f"v{right['version']}"
    prefix = dataset_prefix([left, right])
    lines = [f"{model}: {v1} -> {v2}", "",
             f"data ({prefix} at shards commit {left['data']['shards_commit'][:12]} -> "
             f"{right['data']['shards_commit'][:12]}):"]
    if data_rows:
        size = lambda n: "—" if n is None else f"{n:,} B"  # noqa: E731
        lines.extend(table(["change", "path", f"size {v1}", f"size {v2}"],
                           [[c, p, size(a), size(b)] for c, p, a, b in data_rows]))
        counts = {k: sum(1 for r in data_rows if r[0] == k) for k in ("added", "removed", "changed")}
        lines.append("  " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    else:
        lines.append("  (no objects differ: both versions were trained on the same data)")
    rows = compare_rows([left, right])
    for section, _ in SECTIONS[:3]:  # overrides and sweep, parameters, metrics
        if not any(r[0] == section for r in rows):
            continue  # no version had overrides or a sweep
        body = [[key, format_value(vals[0]), format_value(vals[1])] for s, key, vals, d in rows if s == section and d]
        lines += ["", f"{section}:"]
        lines.extend(table(["field", v1, v2], body) if body else ["  (no differences)"])
    return "\n".join(lines)


# --- reproduce -----------------------------------------------------------------------------------
def format_reproduction(record: dict, rows: list[tuple[str, object, object, bool | None]], tolerance: float) -> str:
    body = []
    for name, a, b, ok in rows:
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            delta = f"{b - a:+.3e}"
        else:
            delta = "identical" if a == b else "different"
        body.append([DIFF_MARK if ok is False else "", name, format_value(a), format_value(b), delta])
    exact = any(name == "weights sha256" and ok is not None for name, _, _, ok in rows)  # reproduce --exact
    weights = "the weights must be the same bytes" if exact else "the weights rows are for information"
    lines = [f"{record['model']} v{record['version']}: original vs reproduction "
             f"({DIFF_MARK} marks a difference beyond {tolerance:g}; {weights})"]
    lines.extend(table(["", "figure", "original", "reproduction", "difference"], body))
    return "\n".join(lines)
