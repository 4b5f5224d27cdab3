"""Tasks: what a model learns (loss, metrics, predictions), built-in or a user's own ``Task`` subclass,
and evaluating a model on a split with them."""
