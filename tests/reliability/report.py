"""Write RELIABILITY.md from the ledger that `make reliability` produced."""

from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path


def merge(ledger: dict, reruns: list[tuple[dict, str]]) -> tuple[dict, list[str]]:
    """Replace the classes a re-run covered; say which rows came from which command."""
    classes = dict(ledger["classes"])
    said = []
    for rerun, command in reruns:
        classes.update(rerun["classes"])
        said.append(f"Re-run after a fix, replacing the rows {', '.join(repr(c) for c in rerun['classes'])}: "
                    f"`{command}`.")
    return {**ledger, "classes": dict(sorted(classes.items()))}, said


def render(ledger: dict, command: str, reruns: list[str] = ()) -> str:
    lines = [
        "# Reliability",
        "",
        f"Written by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()} machine with Python {platform.python_version()}; "
        f"{'full run' if ledger['full'] else 'sample run (make test size)'}.",
        *(["", *reruns] if reruns else []),
        "",
        "| class | cases tried | survived or refused correctly | nothing lost | how |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for cls, row in ledger["classes"].items():
        lines.append(_row(cls, row))
    lines += [
        "",
        "*Nothing lost* means, per kind of class:",
        "",
        "- **worker SIGKILL**: no temporary or half-written checkpoint directory is left, every remaining "
        "checkpoint verifies against its sha256 manifest, and the resumed run ends with the same weights as "
        "an uninterrupted one;",
        "- **run worker SIGKILL**: the instance is consistent: the killed run is marked failed and its "
        "automatic retry ends in success, resuming from the killed run's last checkpoint;",
        "- **store and S3 outages**: `main` is unchanged or holds only complete versions (lineage record and "
        "weights); for S3, objects written before the outage read back intact after the restart, and a run "
        "that failed succeeds when run again;",
        "- **disk full**: the previous checkpoint still loads and no partial checkpoint or shard set is "
        "listed;",
        "- **load**: every queued run finished, never above the GPU capacity; every new-data commit burst "
        "ended with the newest commit trained; the GraphQL readers (local and production instance, the UI's own "
        "operations) saw no error, their latency reported beside it (docs/reliability.md, \"The UI under load\");",
        "- **bad input and security**: refused before anything was written (the store stays clean), or "
        "nothing to lose (pure validation).",
        "",
    ]
    return "\n".join(lines)


def _row(cls: str, row: dict) -> str:
    pct = 100.0 * row["ok"] / row["tried"] if row["tried"] else 0.0
    lost = 100.0 * row["nothing_lost"] / row["tried"] if row["tried"] else 0.0
    return (f"| {cls} | {row['tried']} | {row['ok']} ({pct:.0f} %) | {row['nothing_lost']} ({lost:.0f} %) | "
            f"{'; '.join(row['notes'])} |")


def splice(report: str, rerun: dict, command: str, why: str) -> str:
    """``report`` (a written RELIABILITY.md) with the rows of the classes ``rerun`` covered
    replaced, and a line naming the re-run: for a re-run after the full run's ledger is gone."""
    lines = report.split("\n")
    table = [i for i, line in enumerate(lines)
             if line.startswith("| ") and not line.startswith(("| class |", "| --- |"))]
    rows = {lines[i][2:].split(" | ", 1)[0]: i for i in table}
    for cls, row in rerun["classes"].items():
        if cls in rows:
            lines[rows[cls]] = _row(cls, row)
        else:  # a class the full run did not have: keep the table sorted by class
            after = max([i for c, i in rows.items() if c < cls], default=table[0] - 1)
            lines.insert(after + 1, _row(cls, row))
            rows = {c: (i + 1 if i > after else i) for c, i in rows.items()} | {cls: after + 1}
    header = next(i for i, line in enumerate(lines) if line.startswith("| class |"))
    names = ", ".join(repr(c) for c in rerun["classes"])
    lines.insert(header - 1, f"Re-run after a change, replacing the rows {names}: `{command}` ({why}).")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--splice":
        # report.py --splice REPORT.md RERUN_LEDGER COMMAND WHY
        report_path, rerun_path, command, why = sys.argv[2:]
        Path(report_path).write_text(splice(Path(report_path).read_text(),
                                            json.loads(Path(rerun_path).read_text()), command, why))
        sys.exit(0)
    from tests.reliability.soak.report_section import soak_section, splice_soak

    if sys.argv[1] == "--soak-only":
        # report.py --soak-only REPORT.md SOAK_JSON COMMAND: replace the soak section after a soak run alone
        report_path, soak_path, command = sys.argv[2:]
        section = soak_section(json.loads(Path(soak_path).read_text()), command)
        Path(report_path).write_text(splice_soak(Path(report_path).read_text(), section))
        sys.exit(0)
    # report.py LEDGER OUT.md COMMAND [--soak SOAK_JSON] [RERUN_LEDGER RERUN_COMMAND ...]
    ledger_path, out_path, command, *rest = sys.argv[1:]
    soak = json.loads(Path(rest[1]).read_text()) if rest[:1] == ["--soak"] else None
    rest = rest[2:] if soak is not None else rest
    pairs = [(json.loads(Path(rest[i]).read_text()), rest[i + 1]) for i in range(0, len(rest), 2)]
    merged, said = merge(json.loads(Path(ledger_path).read_text()), pairs)
    text = render(merged, command, said)
    Path(out_path).write_text(text + "\n" + soak_section(soak, command) if soak is not None else text)
