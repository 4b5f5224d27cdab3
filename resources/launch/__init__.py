"""Training launchers: where the distributed training op's workers run."""
