"""RELIABILITY.md is rendered from a ledger, and a later re-run of some classes replaces their rows."""

from tests.reliability.report import merge, render, splice


def _ledger(**classes):
    return {"full": True, "classes": {c: {"tried": t, "ok": ok, "nothing_lost": nl, "notes": notes}
                                      for c, (t, ok, nl, notes) in classes.items()}}


def test_splice_replaces_the_rerun_rows_and_names_the_rerun():
    full = _ledger(**{"fault: a": (10, 9, 9, ["old"]), "fault: b": (10, 10, 10, []), "load: c": (1, 1, 1, [])})
    report = render(full, "make reliability")
    rerun = _ledger(**{"fault: a": (10, 10, 10, ["new"]), "fault: ab": (3, 3, 2, [])})
    out = splice(report, rerun, "pytest -k a", "after the fix")
    assert "| fault: a | 10 | 10 (100 %) | 10 (100 %) | new |" in out
    assert "| fault: a | 10 | 9 (90 %)" not in out
    rows = [line.split(" | ")[0][2:] for line in out.split("\n")
            if line.startswith("| ") and not line.startswith(("| class |", "| --- |"))]
    assert rows == ["fault: a", "fault: ab", "fault: b", "load: c"]
    assert "Re-run after a change, replacing the rows 'fault: a', 'fault: ab': `pytest -k a` (after the fix)." in out
    # the same as rendering the merged ledger, apart from the header lines
    merged, _ = merge(full, [(rerun, "pytest -k a")])
    assert [ln for ln in out.split("\n") if ln.startswith("| ")] == \
        [ln for ln in render(merged, "x").split("\n") if ln.startswith("| ")]
