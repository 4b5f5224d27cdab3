"""Proposed change for training_runtime/data.py (measured as loader ``ours_proposed``; applied by
the runtime's owner): in ``SplitData._take_sorted`` keep ``np.take(..., out=out[a:e],
mode="clip")`` for small samples and copy large samples with an advanced index into the slice,
``out[a:e] = shard[local]``.

Measured side by side (results.json history; ratios to the memory-read limit), two re-runs:
192 KB samples: 363bf0b's ``np.take`` 0.27x / 0.32x, advanced indexing into the slice 0.43x (all
samples) / 0.40x (this hybrid), the gather before 363bf0b 0.32x / 0.46x; 4 KB samples: ``np.take``
0.24x / 0.21x, advanced indexing 0.15x, this hybrid 0.24x, before 363bf0b 0.15x / 0.13x. So the
hybrid keeps the 4 KB gain and recovers part of the 192 KB loss; the old unsorted gather was still
ahead at 192 KB. Why the memory-mapped source favours advanced indexing for large rows is not
established: on in-memory arrays ``np.take`` was ~2x faster and neither variant gained from a
second thread. The threshold (64 KiB per sample) lies between the two measured sizes; not tuned.
"""

from __future__ import annotations

import math

import numpy as np

from training_runtime.data import SplitData

LARGE_SAMPLE_BYTES = 64 * 1024


class SplitDataFancySlices(SplitData):
    def _take_sorted(self, idx: np.ndarray, out: np.ndarray) -> None:
        large = math.prod(self.feature_shape) * 4 >= LARGE_SAMPLE_BYTES
        bounds = np.searchsorted(idx, self.starts)
        for s in range(len(self.features)):
            a, e = bounds[s], bounds[s + 1]
            if a < e:
                if large:
                    out[a:e] = self.features[s][idx[a:e] - self.starts[s]]
                else:
                    np.take(self.features[s], idx[a:e] - self.starts[s], axis=0, out=out[a:e], mode="clip")
