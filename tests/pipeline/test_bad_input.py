"""Bad sources fail the run with a message naming the problem; main in the store is unchanged."""

from __future__ import annotations

import pandas as pd
import pytest

from core.registry import list_versions
from pipelines.models.digits import PIXELS, digits_pipeline, write_digits_source
from tests.pipeline.conftest import failure_messages


def _prepare(platform, mutate):
    path = write_digits_source(platform.sources)
    if mutate is not None:
        mutate(path)
    store = platform.store()
    store.ensure_repository()
    return store, store.resolve_ref("main")


def _drop_column(path):
    frame = pd.read_csv(path)
    frame.drop(columns=[PIXELS[5]]).to_csv(path, index=False)


def _unknown_label(path):
    frame = pd.read_csv(path)
    frame.loc[3, "label"] = 11
    frame.to_csv(path, index=False)


def _empty(path):
    path.write_text("")


def _missing(path):
    path.unlink()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (_missing, "matches no file"),
        (_empty, "is empty"),
        (_drop_column, "lacks column(s) pixel_5"),
        (_unknown_label, "outside the known classes"),
    ],
)
def test_bad_source_fails_clearly_and_main_is_unchanged(platform, mutate, message):
    store, main_before = _prepare(platform, mutate)
    result = platform.run(digits_pipeline)
    assert not result.success
    assert message in failure_messages(result)
    assert store.resolve_ref("main") == main_before
    assert list_versions(store, "digits") == []
    assert not store.list_objects("main", prefix="datasets/")
