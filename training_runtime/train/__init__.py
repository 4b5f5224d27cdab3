"""Training: the context shared by the built-in trainer and users' own functions, the trainer, the
user-loop entry, numeric settings, and the records that early stopping and sweeps read."""
