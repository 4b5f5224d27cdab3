from tests.runtime.conftest import world_of_one  # noqa: F401 (the in-process gloo group of one rank)
