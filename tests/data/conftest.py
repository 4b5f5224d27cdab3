from tests.pipeline.conftest import platform  # noqa: F401
