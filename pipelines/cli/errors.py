"""The CLI's own errors; ``main`` turns them into a one-line message and an exit status."""


class UsageError(ValueError):
    """Arguments that parse but make no sense together."""


class ReproductionError(RuntimeError):
    """The reproduction's training run failed."""
