"""The model-versions notebook runs top to bottom on the demo platform's two versions."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.cli.demo_platform import shared_demo_platform

pytestmark = pytest.mark.slow
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "model_versions.ipynb"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return shared_demo_platform(tmp_path_factory)


def _outputs(cell) -> tuple[str, set[str]]:
    text, kinds = [], set()
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            text.append(out["text"])
        for mime, value in out.get("data", {}).items():
            kinds.add(mime)
            if mime in ("text/plain", "text/html"):
                text.append(value)
    return "\n".join(text), kinds


def test_notebook_lists_compares_plots_and_predicts(demo, monkeypatch, tmp_path):
    for key, value in demo.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    nbformat.write(nb, tmp_path / "executed.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    texts = [_outputs(c)[0] for c in code]
    kinds = [_outputs(c)[1] for c in code]
    store = demo.store()
    # The versions table lists both versions with their recorded accuracy.
    versions_text = next(t for t in texts if "test accuracy" in t and "shards commit" in t)
    for v in (1, 2):
        record = cli_record(store, v)
        assert record["dagster"]["run_id"] in versions_text
    # The comparison shows the parameters that differ between the two demo versions.
    comparison = next(t for t in texts if "differs" in t)
    for field in ("train.seed", "train.lr", "train.epochs", "shards commit"):
        assert field in comparison
    # Data changes between the two dataset commits, as the diff command shows them.
    data_changes = next(t for t in texts if "datasets/digits/raw/data.parquet" in t)
    assert "changed" in data_changes
    # Two loss curves were plotted, each from its checkpoint's metrics.json.
    assert sum("image/png" in k for k in kinds) >= 2
    curves = next(t for t in texts if "last loss" in t)
    assert "'v1'" in curves and "'v2'" in curves
    # The loaded v2 reproduces its recorded test accuracy (the notebook asserts it too).
    record = cli_record(store, 2)
    assert f"test accuracy {record['evaluation']['test']['accuracy']:.4f}" in "\n".join(texts)
    assert "predicted" in "\n".join(texts)


def cli_record(store, version: int) -> dict:
    from core.registry import read_lineage

    return read_lineage(store, "digits", version)
