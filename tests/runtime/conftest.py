import pytest
import torch.distributed as dist

from training_runtime.distributed import DistInfo, close_distributed, init_distributed


@pytest.fixture(scope="session")
def world_of_one(tmp_path_factory) -> DistInfo:
    """An in-process gloo group of one rank (what the runtime does without torchrun)."""
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in the test process")
    info = init_distributed()
    yield info
    close_distributed()
