"""Ops: the distributed training op, evaluation and registration, store housekeeping."""
