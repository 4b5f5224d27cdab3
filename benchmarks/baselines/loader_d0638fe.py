"""The loader of v1 shards as it was at commit d0638fe, kept to measure this change side by side
(loader ``ours_before`` of benchmarks/loaders.py, the stall probe's ``before``).

At d0638fe v1 shards had their own loader (``data.v1.PrefetchLoader``): one batch per load, each
gathered into freshly allocated arrays (a page fault per 4 KB of every batch), with the gather of
that commit: one ``np.take`` per shard for samples under 64 KB, an advanced index into the output
slice for larger ones (two copies). Here that behaviour runs over today's reader (the v1 files
read as the columns ``features`` and ``label``), so only the loading differs."""

from __future__ import annotations

import numpy as np
import torch

from training_runtime.data.gather import RowPlan, plan_batches
from training_runtime.data.loader import TypedLoader

LARGE_SAMPLE_BYTES = 64 * 1024  # d0638fe's switch to the advanced-index copy


def take_rows_d0638fe(arrays: list[np.ndarray], plan: RowPlan, out: np.ndarray) -> None:
    """d0638fe's ``take_rows`` for sorted rows (what the loader asks for)."""
    large = out[0].nbytes >= LARGE_SAMPLE_BYTES if len(out) else False
    local = plan.local
    for s, a, e in plan.segments:
        if large:
            out[a:e] = arrays[s][local[a:e]]
        else:
            np.take(arrays[s], local[a:e], axis=0, out=out[a:e], mode="clip")


class TypedLoaderBefore(TypedLoader):
    """``TypedLoader`` loading as d0638fe's v1 loader did: one batch per load, fresh arrays."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "batches_per_load": 1})

    def _load(self, batches: list[np.ndarray]) -> list[dict[str, torch.Tensor]]:
        (idx,) = batches
        plan = plan_batches(self.split.starts, batches)
        out = {}
        for f in self.fields:
            dest = np.empty((len(idx), *f.column.shape), np.dtype(f.column.dtype))
            take_rows_d0638fe(self.split._rows[f.name].arrays, plan, dest)
            out[f.name] = torch.from_numpy(dest)
        return [out]
