"""The temporary platform of tests/pipeline (instance, store and state under tmp_path)."""

from tests.pipeline.conftest import platform  # noqa: F401  (fixture)
