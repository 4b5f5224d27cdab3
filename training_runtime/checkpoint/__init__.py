"""Checkpoints: full (one file, written by rank 0) and sharded (every rank its shards), published
atomically and verified on resume."""
