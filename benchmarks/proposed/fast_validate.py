"""Proposed change for assets/source.py (measured here as preprocessing ``platform_fast``; applied
by its owner): ``validate_frame`` with a vectorised happy path.

Profiling ``load_frame`` + ``build_shards`` (py-spy, 28 MB CSV of 256 float columns) put ~30-40 %
of the time in ``validate_frame``: ``features.apply(pd.to_numeric)`` builds one Series per column
and a new frame, then ``out[features] = numeric.astype(np.float32)`` writes 256 columns back one by
one. When every feature column already has a numeric dtype (what a CSV of numbers parses to), one
``to_numpy(float64)`` does the conversion and one DataFrame constructor builds the result. Anything
the fast path does not accept (non-numeric dtypes, NaN/inf, unknown or missing labels, missing or
duplicate ids, missing columns, no rows) goes through the unchanged ``validate_frame``, which
raises the platform's own messages; so the accepted frames, and the shards built from them, are
the same (the benchmark checks the shards' sha256 digests).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from assets.source import _label_text, validate_frame
from assets.spec import PipelineSpec


def validate_frame_fast(spec: PipelineSpec, frame: pd.DataFrame) -> pd.DataFrame:
    from pandas.api.types import is_numeric_dtype

    cols = list(spec.feature_columns)
    wanted = cols + [spec.label_column] + ([spec.id_column] if spec.id_column else [])
    if len(frame) == 0 or any(c not in frame.columns for c in wanted) or \
            not all(is_numeric_dtype(frame[c].dtype) for c in cols):
        return validate_frame(spec, frame)
    x = frame[cols].to_numpy(dtype=np.float64)
    labels = frame[spec.label_column]
    ids = frame[spec.id_column] if spec.id_column else None
    if not np.isfinite(x).all() or labels.isna().any() or \
            (ids is not None and (ids.isna().any() or ids.duplicated().any())):
        return validate_frame(spec, frame)
    text = labels.map(_label_text).astype(str)
    if not set(text.unique()) <= set(spec.class_names):
        return validate_frame(spec, frame)
    out = pd.DataFrame(x.astype(np.float32), columns=cols)
    out[spec.label_column] = text.to_numpy()
    if ids is not None:
        out[spec.id_column] = ids.astype(str).to_numpy()
    return out[wanted]
