"""The data key decides whether a run reuses a published dataset version: each of its parts
changes with what it covers and with nothing else, and it is the same in every process."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pandas as pd

from assets.data_key import data_key, frame_sha256, identity
from pipelines.models.digits import digits_pipeline

SOURCES = [{"file": "digits.csv", "bytes": 10, "sha256": "a" * 64}]
REPO = Path(__file__).resolve().parents[2]


def _changed(a: dict, b: dict) -> set[str]:
    return {k for k in ("sources", "parameters", "code") if a[k] != b[k]}


def test_each_part_changes_with_what_it_covers_only():
    base = data_key(digits_pipeline, SOURCES)
    assert _changed(base, data_key(digits_pipeline, [{**SOURCES[0], "sha256": "b" * 64}])) == {"sources"}
    two = SOURCES + [{"file": "more.csv", "bytes": 3, "sha256": "c" * 64}]
    assert data_key(digits_pipeline, two) == data_key(digits_pipeline, two[::-1])  # listing order is no content
    reseeded = dataclasses.replace(digits_pipeline, split=dataclasses.replace(digits_pipeline.split, seed=7))
    assert _changed(base, data_key(reseeded, SOURCES)) == {"parameters"}
    other_suite = dataclasses.replace(digits_pipeline, expectations=dataclasses.replace(
        digits_pipeline.expectations, raw=lambda spec: {}))
    assert _changed(base, data_key(other_suite, SOURCES)) == {"parameters"}
    # A model's settings are not data: retraining with another recipe keeps the data key.
    retuned = dataclasses.replace(digits_pipeline, recipe=dataclasses.replace(digits_pipeline.recipe, lr=0.5))
    assert data_key(retuned, SOURCES) == base


def test_a_frame_is_keyed_by_its_cells_columns_and_dtypes():
    frame = pd.DataFrame({"x": [1.0, 2.0], "label": ["a", "b"]})
    assert frame_sha256(frame) == frame_sha256(frame.copy())
    assert frame_sha256(frame) != frame_sha256(frame.assign(x=[1.0, 2.5]))
    assert frame_sha256(frame) != frame_sha256(frame.astype({"x": "float32"}))
    assert frame_sha256(frame) != frame_sha256(frame.rename(columns={"x": "y"}))


def test_code_whose_source_cannot_be_read_is_never_taken_for_the_same():
    assert identity(len)["repr"] == repr(len)  # a builtin: named by its repr, unreadable source
    assert identity(data_key)["source_sha256"] == identity(data_key)["source_sha256"]


def test_the_key_is_the_same_in_a_fresh_process():
    code = ("from assets.data_key import data_key; from pipelines.models.digits import digits_pipeline; "
            f"print(data_key(digits_pipeline, {SOURCES!r})['sha256'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == data_key(digits_pipeline, SOURCES)["sha256"]
