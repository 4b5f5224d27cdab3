"""ONNX export of a trained model, checked against PyTorch on real inputs.

A model is exported once, with the batch dimension dynamic, then the ONNX graph and the PyTorch
model are run on the same batches (of other sizes than the example, so a batch size baked into
the graph shows) and their outputs compared. A model that cannot be exported is still a model:
``export_and_check`` turns the failure into a record that says why, for the model version to
carry.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from training_runtime.atomic_files import atomic_path
from training_runtime.data.shards import sha256_file

ONNX_OPSET = 17
# The TorchScript-based ("legacy") exporter: it takes about 0.3 s for the built-in models here,
# the torch.export-based (dynamo) one about 6 s, and it traces exactly the forward that runs.
EXPORTER = "torch.onnx.export (TorchScript, dynamo=False)"
INPUT_NAME, OUTPUT_NAME = "input", "output"


def export_onnx(model: torch.nn.Module, example_input: torch.Tensor, path: str | Path) -> dict:
    """Write ``model`` (in eval mode) as ONNX to ``path``; the batch dimension is dynamic."""
    path = Path(path)
    model.eval()
    with atomic_path(path) as tmp, torch.no_grad(), warnings.catch_warnings():
        # The legacy exporter is chosen on purpose (see EXPORTER); its deprecation notice is noise.
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*legacy TorchScript-based ONNX")
        torch.onnx.export(model, (example_input,), str(tmp), dynamo=False, opset_version=ONNX_OPSET,
                          input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}})
    return {"file": path.name, "opset": ONNX_OPSET, "exporter": EXPORTER, "sha256": sha256_file(path)}


def check_onnx(path: str | Path, model: torch.nn.Module, batches: Iterable[torch.Tensor],
               tolerance: float = 1e-4) -> dict:
    """Run the ONNX file (onnxruntime, CPU) and ``model`` on each batch; the largest absolute
    difference of their outputs, and whether it is within ``tolerance``."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model.eval()
    max_diff, samples = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            ours = session.run([OUTPUT_NAME], {INPUT_NAME: batch.detach().cpu().numpy()})[0]
            theirs = model(batch).detach().float().cpu().numpy()
            if ours.shape != theirs.shape:
                raise ValueError(f"ONNX output shape {list(ours.shape)} differs from PyTorch's {list(theirs.shape)} "
                                 f"for an input of shape {list(batch.shape)}")
            max_diff = max(max_diff, float(np.max(np.abs(ours.astype(np.float64) - theirs))) if ours.size else 0.0)
            samples += int(batch.shape[0])
    if samples == 0:
        raise ValueError("no samples to check the ONNX export on; give at least one non-empty batch")
    return {"max_abs_diff": max_diff, "tolerance": tolerance, "passed": bool(max_diff <= tolerance),
            "num_samples": samples}


def export_and_check(model: torch.nn.Module, batches: Iterable[torch.Tensor], path: str | Path,
                     tolerance: float = 1e-4) -> dict:
    """Export with the first batch as the example and check on all of them.

    ``{"ok": True, file, opset, exporter, sha256, max_abs_diff, tolerance, passed, num_samples}``
    when both ran (``passed`` says whether they agree), ``{"ok": False, "error": "<type>: <message>"}``
    when either raised: a model the exporter cannot handle is still registered, and this record is
    where its version says why it has no ONNX file."""
    batches = list(batches)
    try:
        if not batches:
            raise ValueError("no batches to export and check the model with; give at least one")
        exported = export_onnx(model, batches[0], path)
        checked = check_onnx(path, model, batches, tolerance)
    except Exception as exc:  # any failure of the exporter or the model: recorded with its real reason
        Path(path).unlink(missing_ok=True)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, **exported, **checked}
