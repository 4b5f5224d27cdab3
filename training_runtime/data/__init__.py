"""Reading shards: the typed shard format, locating and verifying files, sampling per rank, gathering
rows, decoding and augmenting, and the background loaders that feed a training step."""
