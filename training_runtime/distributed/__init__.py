"""The process group and data-parallel wrapping (DDP, FSDP2, HSDP) of a training."""
