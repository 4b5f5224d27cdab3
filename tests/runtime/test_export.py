"""ONNX export: the graph agrees with PyTorch on batch sizes it was not traced with, a disagreement
is seen, and a model the exporter cannot handle becomes a record naming the real exception."""

from __future__ import annotations

import copy

import onnx
import pytest
import torch

from training_runtime.data.shards import sha256_file
from training_runtime.serve.export import check_onnx, export_and_check, export_onnx
from training_runtime.models.builtin import build_model


def test_mlp_export_agrees_with_pytorch_on_other_batch_sizes(tmp_path):
    torch.manual_seed(0)
    model = build_model("mlp", [6], 3, hidden_sizes=[8]).eval()
    batches = [torch.randn(2, 6), torch.randn(5, 6), torch.randn(1, 6)]
    result = export_and_check(model, batches, tmp_path / "model.onnx")
    assert result["ok"] is True and result["passed"] is True
    assert result["num_samples"] == 8
    assert result["max_abs_diff"] <= result["tolerance"] == 1e-4
    assert result["sha256"] == sha256_file(tmp_path / "model.onnx")
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    assert [i.name for i in graph.input] == ["input"] and [o.name for o in graph.output] == ["output"]
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_token_model_exports_with_int64_input(tmp_path):
    torch.manual_seed(0)
    model = build_model("transformer_lm", [12], 40, d_model=16, nhead=2, num_layers=1, dim_feedforward=32)
    batches = [torch.randint(0, 40, (2, 12)), torch.randint(0, 40, (3, 12))]
    result = export_and_check(model, batches, tmp_path / "lm.onnx")
    assert result["ok"] and result["passed"], result
    assert result["opset"] == 17 and "dynamo=False" in result["exporter"]


def test_check_sees_a_graph_that_disagrees_with_the_model(tmp_path):
    torch.manual_seed(0)
    model = build_model("mlp", [4], 2, hidden_sizes=[8]).eval()
    export_onnx(model, torch.randn(2, 4), tmp_path / "m.onnx")
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.net[-1].bias += 1.0  # every output moves by exactly 1
    result = check_onnx(tmp_path / "m.onnx", other, [torch.randn(3, 4)])
    assert result["passed"] is False
    assert result["max_abs_diff"] == pytest.approx(1.0, abs=1e-5)


class SingularValues(torch.nn.Module):
    """aten::linalg_svd has no ONNX symbolic: the exporter refuses it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.svd(x.reshape(x.shape[0], 2, 2))[1]


class ThroughNumpy(torch.nn.Module):
    """.numpy() leaves the traced graph: the export is a constant with no input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy() * 2.0)


def test_unsupported_operator_becomes_a_record_naming_it(tmp_path):
    result = export_and_check(SingularValues(), [torch.randn(2, 4)], tmp_path / "svd.onnx")
    assert result["ok"] is False
    assert result["error"].startswith("UnsupportedOperatorError: ")
    assert "linalg_svd" in result["error"]
    assert not (tmp_path / "svd.onnx").exists()


def test_forward_through_numpy_fails_the_check_with_its_reason(tmp_path):
    result = export_and_check(ThroughNumpy(), [torch.randn(2, 3), torch.randn(4, 3)], tmp_path / "np.onnx")
    assert result == {"ok": False, "error": result["error"]}
    assert result["error"].startswith("InvalidArgument: ") and "input" in result["error"]


def test_no_batches_is_a_recorded_error(tmp_path):
    result = export_and_check(build_model("mlp", [2], 2), [], tmp_path / "x.onnx")
    assert result == {"ok": False, "error": "ValueError: no batches to export and check the model with; "
                                            "give at least one"}
