"""Object storage for large artifacts (checkpoints, weights): local disk or S3."""
