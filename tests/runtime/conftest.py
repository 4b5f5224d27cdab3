import pytest
import torch.distributed as dist

from training_runtime.distributed.process_group import DistInfo, close_distributed, init_distributed


@pytest.fixture(scope="module")
def world_of_one() -> DistInfo:
    """An in-process gloo group of one rank (what the runtime does without torchrun), torn down
    after the module so no process group outlives these tests."""
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in the test process")
    info = init_distributed()
    yield info
    close_distributed()
