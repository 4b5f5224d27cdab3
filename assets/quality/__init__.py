"""Great Expectations gates on the raw dataset and the shards (blocking Dagster asset checks)."""

from assets.quality.runner import QualityReport, run_suite
from core.expectations import standard_raw_expectations, standard_shard_expectations
from assets.quality.tables import ShardTables, raw_tables, shard_tables, untrained_labels

__all__ = ["QualityReport", "ShardTables", "run_suite", "raw_tables", "shard_tables", "standard_raw_expectations",
           "standard_shard_expectations", "untrained_labels"]
