"""The shipped diabetes_mlp, as a user meets it: trained by its pipeline (real Dagster run, torchrun
with 2 gloo ranks), exported with ``python -m pipelines export``, then served twice on every one of
the 442 patients: by ``predict`` and by a server that reads only the exported card and model.onnx.

Before predict kept float64 values (the card's postprocessing), it rounded them to float32: 41 of
the 442 rows differed from the card's server by more than 1e-5, up to 3e-5."""

from __future__ import annotations

import pytest

from pipelines.cli import main
from pipelines.models.diabetes import diabetes_dataset, diabetes_mlp, load_diabetes_frame
from tests.pipeline.conftest import failure_messages, platform  # noqa: F401  (fixture)
from tests.serving.test_card_alone import assert_diabetes_rows_agree

pytestmark = pytest.mark.slow


def test_every_diabetes_row_served_from_the_exported_card_agrees_with_predict(platform, tmp_path,  # noqa: F811
                                                                              monkeypatch, capsys):
    result = platform.run(diabetes_dataset, specs=[diabetes_dataset, diabetes_mlp])
    assert result.success, failure_messages(result)
    monkeypatch.setenv("DAGSTER_HOME", str(platform.root))
    monkeypatch.delenv("PLATFORM_PROFILE", raising=False)
    folder = tmp_path / "deploy"
    assert main(["export", "diabetes_mlp", "--version", "1", str(folder)]) == 0, capsys.readouterr().err
    assert (folder / "model.onnx").is_file()
    rows = tmp_path / "patients.csv"
    load_diabetes_frame().to_csv(rows, index=False)
    assert_diabetes_rows_agree(folder, rows)
