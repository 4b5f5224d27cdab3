"""Great Expectations suites of the digits pipeline: what its raw data and shards must satisfy."""

from __future__ import annotations

from pipelines.api import PipelineSpec, QualitySuite, standard_raw_expectations, standard_shard_expectations


def raw(spec: PipelineSpec) -> dict[str, list]:
    """Pixels are grey levels 0..16; about 180 images per digit; 1,797 images in the bundled copy."""
    import great_expectations as gx

    suite = standard_raw_expectations(spec, min_rows=1000, max_rows=100_000, value_range=(0, 16),
                                      min_class_share=0.05)
    suite["rows"].append(gx.expectations.ExpectColumnValuesToMatchRegex(column="image_id", regex=r"^digit-\d{5}$"))
    return suite


def shards(spec: PipelineSpec) -> dict[str, list]:
    """Normalised pixels stay within 100 standard deviations (the bundled data reaches ~37)."""
    return standard_shard_expectations(spec, max_abs_feature=100.0, max_fraction_error=0.05)


suite = QualitySuite(raw=raw, shards=shards)
