"""The runtime's shard gather as it was before commit 363bf0b (a240667), kept to measure that
change side by side (loader ``ours_before``): per shard an ``np.unique`` + ``np.nonzero`` pass, a
fancy index of the ``np.memmap`` (first copy) scattered into ``out[pos]`` (second copy), batches
in sampler order. 363bf0b sorts each batch and ``np.take``s each shard's run straight into
``out`` (``mode="clip"``: the default ``"raise"`` buffers ``out``, a hidden second copy)."""

from __future__ import annotations

import numpy as np

from training_runtime.data.v1 import SplitData


class SplitDataBefore(SplitData):
    def gather(self, idx: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        if out is None:
            out = np.empty((len(idx), *self.feature_shape), dtype=np.float32)
        shard_of = np.searchsorted(self.starts, idx, side="right") - 1
        for s in np.unique(shard_of):
            pos = np.nonzero(shard_of == s)[0]
            out[pos] = self.features[s][idx[pos] - self.starts[s]]
        return out, self.labels[idx]

