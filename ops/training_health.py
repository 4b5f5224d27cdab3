"""The checkpoint's "training_health" asset check: what the runtime's guards detected during the
training (non-finite loss, loss spikes, stragglers, data stalls, GPU health, hangs), shown in the UI.

It reads the ``detections`` list of the run's metrics.json, committed beside the weights: those of
every attempt, a restarted or retried one's too (each names its ``attempt``, an index into
metrics.json's ``attempts``), and how each attempt ended. A fault the training recovered from (a
hang or a killed worker in an attempt torchrun restarted) passes it, named first in its
description and logged as a warning; guards that warned in the attempts that made the weights
fail it with severity WARN (the UI shows a warning). A fault in the attempt that produced the
weights is an ERROR. It never blocks: the model still evaluates and may register; the findings
stay on the checkpoint's Checks tab.
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


def _named(detection: dict) -> str:
    return (f"{detection.get('detector', 'unknown')} at step {detection.get('step')}"
            + (f" on rank {detection['rank']}" if detection.get("rank") is not None else "")
            + f": {detection.get('message', '')}")


def _fault(index: int, attempt: dict, detections: list[dict]) -> str:
    """What ended attempt ``index`` (1-based): its error-severity detection (a hang, a
    non-finite stop) when one fired, else its recorded reason (a killed worker)."""
    fired = [d for d in detections if d.get("attempt") == index and d.get("severity") == "error"]
    what = _named(fired[0]) if fired else (attempt.get("reason") or "no reason recorded")
    return f"attempt {index} {attempt.get('ended', 'failed')} ({what})"


def training_health_result(metrics: dict) -> dg.AssetCheckResult:
    """Passes when the training's metrics list no detection and every attempt but the last
    completed, and when the training recovered from every fault it met (an attempt torchrun
    restarted, a failed launch a retry resumed): the description then names the faults first,
    and the check's step logs them as a warning (``build_training_health_check``). Guards that
    warned in the attempts that made the weights fail it as a warning listing them (detector,
    step, rank, message), with a count per detector; a fault in the attempt that produced the
    weights (an error-severity detection, or an attempt that did not complete) fails it as an
    error."""
    detections = [d for d in metrics.get("detections") or [] if isinstance(d, dict)]
    attempts = [a for a in metrics.get("attempts") or [] if isinstance(a, dict)]
    counts = Counter(str(d.get("detector", "unknown")) for d in detections)
    metadata: dict = {"detections": len(detections),
                      **{f"detections_{name}": n for name, n in sorted(counts.items())}}
    if attempts:
        metadata["attempts"] = len(attempts)
    ended = [(i, a) for i, a in enumerate(attempts, 1) if a.get("ended") != "completed"]
    last = len(attempts)
    final_fault = (any(i == last for i, _ in ended)
                   or any(d.get("severity") == "error" and d.get("attempt", last) == last for d in detections))
    recovered_from = {i for i, _ in ended if i != last}
    recovered = [_fault(i, a, detections) for i, a in ended if i in recovered_from]
    # Detections of an attempt the training recovered from are that fault's; others are findings.
    findings = [d for d in detections if d.get("attempt") not in recovered_from]
    if recovered:
        metadata["recovered_faults"] = len(recovered)
    if not detections and not ended:
        return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
                                   description="no guard fired during the training")
    if detections:
        metadata["detected"] = dg.MetadataValue.md(detections_table(detections, attempts=len(attempts) > 1))
    parts = []
    if recovered:
        parts.append(f"recovered from {len(recovered)} fault(s): " + "; ".join(recovered)
                     + f"; attempt {last} completed")
    if detections:
        shown = [_named(d) for d in detections[:DESCRIBED]]
        more = f" (and {len(detections) - DESCRIBED} more)" if len(detections) > DESCRIBED else ""
        if len(attempts) > 1:
            more += f", over {len(attempts)} attempts"
        parts.append(f"{len(detections)} detection(s): " + "; ".join(shown) + more)
    severity = dg.AssetCheckSeverity.ERROR if final_fault else dg.AssetCheckSeverity.WARN
    return dg.AssetCheckResult(passed=not (final_fault or findings), severity=severity, metadata=metadata,
                               description=". ".join(parts)[:1000])


def checkpoint_metrics_path(checkpoint: dict) -> str:
    """The metrics.json committed beside the checkpoint's weights (ops/training.py's folder)."""
    folder = checkpoint["weights_path"].rpartition("/")[0]
    return f"{folder}/{METRICS_FILE}" if folder else METRICS_FILE


def build_training_health_check(checkpoint_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=checkpoint_key, name=CHECK_NAME, blocking=False,
                    description="Warns with what the training's guards detected: non-finite values, loss "
                                "spikes, stragglers, data stalls, GPU health. Non-blocking.")
    def training_health(context: dg.AssetCheckExecutionContext, checkpoint: dict,
                        store: VersionedStoreResource) -> dg.AssetCheckResult:
        raw = store.get().get_object(checkpoint["commit_id"], checkpoint_metrics_path(checkpoint))
        result = training_health_result(json.loads(raw))
        if "recovered_faults" in result.metadata:  # a warning in the run's log, though the check may pass
            context.log.warning(f"{CHECK_NAME}: {result.description}")
        return result

    return training_health
