"""Proposed change for training_runtime/data.py (measured here as loader ``ours_proposed``,
applied by the runtime's owner): ``SplitData.gather`` copies each sample once instead of twice.

Today ``gather`` fancy-indexes each shard's ``np.memmap`` (a first copy into a temporary array,
through the memmap subclass) and scatters that into ``out[pos]`` (a second copy), after an
``np.unique`` + ``np.nonzero`` pass per shard. Here the batch's indices are sorted once, each
shard's run of indices is taken with ``np.take(..., out=out[a:b], mode="clip")`` straight into the
contiguous output from plain ndarray views of the maps (with the default ``mode="raise"`` numpy
buffers ``out``, a hidden second copy; the indices are in range by construction), and labels are
taken in the same order. A batch holds the same samples as before, in ascending index order (still
a fixed function of seed and epoch).
"""

from __future__ import annotations

import numpy as np

from training_runtime.data import SplitData


class SplitDataOneCopy(SplitData):
    def __init__(self, manifest: dict, paths, split: str):
        super().__init__(manifest, paths, split)
        # plain ndarray views: indexing an np.memmap goes through the subclass' __array_finalize__
        self.features = [np.asarray(f).view(np.ndarray) for f in self.features]

    def gather(self, idx: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Features and labels of the given global sample indices, in ascending index order,
        each sample copied once from its shard into ``out``."""
        if out is None:
            out = np.empty((len(idx), *self.feature_shape), dtype=np.float32)
        idx = np.sort(idx)
        cuts = np.searchsorted(idx, self.starts)
        for s in np.nonzero(cuts[1:] > cuts[:-1])[0]:
            a, b = cuts[s], cuts[s + 1]
            np.take(self.features[s], idx[a:b] - self.starts[s], axis=0, out=out[a:b], mode="clip")
        return out, self.labels[idx]
