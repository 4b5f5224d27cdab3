from tests.pipeline.conftest import platform  # noqa: F401 (the temporary local platform fixture)
