"""Write RELIABILITY.md from the ledger that `make reliability` produced."""

from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path


def render(ledger: dict, command: str) -> str:
    lines = [
        "# Reliability",
        "",
        f"Written by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()} machine with Python {platform.python_version()}; "
        f"{'full run' if ledger['full'] else 'sample run (make test size)'}.",
        "",
        "| class | cases tried | survived or refused correctly | nothing lost | how |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for cls, row in ledger["classes"].items():
        pct = 100.0 * row["ok"] / row["tried"] if row["tried"] else 0.0
        lost = 100.0 * row["nothing_lost"] / row["tried"] if row["tried"] else 0.0
        lines.append(f"| {cls} | {row['tried']} | {row['ok']} ({pct:.0f} %) | {row['nothing_lost']} ({lost:.0f} %) | "
                     f"{'; '.join(row['notes'])} |")
    lines += [
        "",
        "*Nothing lost* means: for training faults, no temporary or half-written checkpoint left and every "
        "remaining checkpoint verifies against its sha256 manifest; for disk-full cases, the previous "
        "checkpoint still loads and no partial one is listed; for store cases, `main` unchanged or fully "
        "published.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    ledger_path, out_path, command = sys.argv[1], sys.argv[2], sys.argv[3]
    Path(out_path).write_text(render(json.loads(Path(ledger_path).read_text()), command))
