"""The checkpoint's "training_health" asset check: what the runtime's guards detected during the
training (non-finite loss, loss spikes, stragglers, data stalls, GPU health, hangs), shown in the UI.

It reads the ``detections`` list of the run's metrics.json, committed beside the weights: those of
every attempt, a restarted or retried one's too (each names its ``attempt``, an index into
metrics.json's ``attempts``). Its
severity is WARN and it does not block: a run whose guards only warned still evaluates and may
register its model; the warnings stay on the checkpoint's Checks tab. (Guards whose severity is
"error" stop the training itself, so no checkpoint reaches this check.)
"""


import json
from collections import Counter

import dagster as dg

from resources.platform import VersionedStoreResource

CHECK_NAME = "training_health"
METRICS_FILE = "metrics.json"  # one of ops.training.MODEL_FILES, beside the weights
LISTED = 50  # detections listed in the check's table; the counts cover all of them
DESCRIBED = 3  # detections named in the check's one-line description


def _rank(detection: dict) -> str:
    return "" if detection.get("rank") is None else str(detection["rank"])


def detections_table(detections: list[dict], *, attempts: bool = False) -> str:
    """Markdown table of the first ``LISTED`` detections, in the order they happened; with
    ``attempts`` (the training took several), a column saying which attempt saw each."""
    head = "| attempt " if attempts else ""
    rows = [f"{head}| detector | severity | step | rank | where | message |",
            ("|---" if attempts else "") + "|---|---|---|---|---|---|"]
    for d in detections[:LISTED]:
        where = ", ".join(str(d[k]) for k in ("host", "gpu") if d.get(k))
        message = str(d.get("message", "")).replace("|", "\\|").replace("\n", " ")
        first = f"| {d.get('attempt', '')} " if attempts else ""
        rows.append(f"{first}| {d.get('detector', 'unknown')} | {d.get('severity', '')} | {d.get('step', '')} "
                    f"| {_rank(d)} | {where} | {message} |")
    if len(detections) > LISTED:
        rows.append(f"\n{len(detections) - LISTED} more in metrics.json")
    return "\n".join(rows)


def training_health_result(metrics: dict) -> dg.AssetCheckResult:
    """Passes when the training's metrics list no detection; otherwise fails as a warning that
    lists them (detector, step, rank, message), with a count per detector."""
    detections = [d for d in metrics.get("detections") or [] if isinstance(d, dict)]
    attempts = [a for a in metrics.get("attempts") or [] if isinstance(a, dict)]
    counts = Counter(str(d.get("detector", "unknown")) for d in detections)
    metadata: dict = {"detections": len(detections),
                      **{f"detections_{name}": n for name, n in sorted(counts.items())}}
    if attempts:
        metadata["attempts"] = len(attempts)
    if not detections:
        return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
                                   description="no guard fired during the training")
    metadata["detected"] = dg.MetadataValue.md(detections_table(detections, attempts=len(attempts) > 1))
    named = [f"{d.get('detector', 'unknown')} at step {d.get('step')}"
             + (f" on rank {d['rank']}" if d.get("rank") is not None else "") + f": {d.get('message', '')}"
             for d in detections[:DESCRIBED]]
    more = f" (and {len(detections) - DESCRIBED} more)" if len(detections) > DESCRIBED else ""
    if len(attempts) > 1:
        more += f", over {len(attempts)} attempts"
    return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
                               description=(f"{len(detections)} detection(s): " + "; ".join(named) + more)[:1000])


def checkpoint_metrics_path(checkpoint: dict) -> str:
    """The metrics.json committed beside the checkpoint's weights (ops/training.py's folder)."""
    folder = checkpoint["weights_path"].rpartition("/")[0]
    return f"{folder}/{METRICS_FILE}" if folder else METRICS_FILE


def build_training_health_check(checkpoint_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=checkpoint_key, name=CHECK_NAME, blocking=False,
                    description="Warns with what the training's guards detected: non-finite values, loss "
                                "spikes, stragglers, data stalls, GPU health. Non-blocking.")
    def training_health(checkpoint: dict, store: VersionedStoreResource) -> dg.AssetCheckResult:
        raw = store.get().get_object(checkpoint["commit_id"], checkpoint_metrics_path(checkpoint))
        return training_health_result(json.loads(raw))

    return training_health
