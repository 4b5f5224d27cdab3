"""Seeded image augmentation for typed-column batches: random crop (from a zero-padded image, or
a window smaller than the stored image) and horizontal flip, on uint8 (H, W, C) samples.

Every random choice is a pure function of (seed, epoch, global sample index): a counter-based
hash (splitmix64) of the three, not a generator stream consumed in loading order. So a sample
gets the same crop and flip whatever batch it lands in, however many loader or decode threads
there are, on whichever rank, and when an epoch is resumed from a later step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic, as the algorithm intends)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def sample_random_words(seed: int, epoch: int, indices: np.ndarray, count: int) -> np.ndarray:
    """``count`` pseudo-random uint64 words per sample, shape (len(indices), count), each a hash
    of (seed, epoch, sample index, word number) alone."""
    key = _splitmix64(np.array([seed % 2**64], dtype=np.uint64))
    key = _splitmix64(key ^ np.uint64(epoch % 2**64))
    per_sample = _splitmix64(key ^ np.asarray(indices, dtype=np.int64).astype(np.uint64))
    words = per_sample[:, None] + np.arange(1, count + 1, dtype=np.uint64)[None, :] * _GOLDEN
    return _splitmix64(words)


@dataclass(frozen=True)
class AugmentDraws:
    """One batch's random choices, per sample: the window's top-left corner in the padded image
    and whether to mirror it."""

    top: np.ndarray
    left: np.ndarray
    flip: np.ndarray


@dataclass(frozen=True)
class ImageAugment:
    """Random crop and horizontal flip of uint8 (H, W, C) samples.

    ``crop``: the output (height, width); None keeps the stored size (then ``padding`` > 0 makes
    it the classic "pad by p, crop back" CIFAR augmentation). ``padding``: zero pixels added on
    every side before the window is chosen. ``hflip``: mirror half of the samples."""

    crop: tuple[int, int] | None = None
    padding: int = 0
    hflip: bool = True

    def __post_init__(self) -> None:
        if self.padding < 0:
            raise ValueError(f"augment padding {self.padding} is negative")
        if self.crop is not None and min(self.crop) < 1:
            raise ValueError(f"augment crop {self.crop} has a side below 1")

    def output_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        """The augmented sample's shape for a stored (H, W, C) sample; raises ValueError when the
        window does not fit in the padded image."""
        if len(stored) != 3:
            raise ValueError(f"image augmentation needs (height, width, channels) samples, not {stored}")
        h, w, c = stored
        ch, cw = self.crop or (h, w)
        if ch > h + 2 * self.padding or cw > w + 2 * self.padding:
            raise ValueError(f"crop {ch}x{cw} is larger than the {h}x{w} image padded by {self.padding}")
        return ch, cw, c

    def draws(self, seed: int, epoch: int, indices: np.ndarray, stored: tuple[int, ...]) -> AugmentDraws:
        h, w, _ = stored
        ch, cw, _ = self.output_shape(stored)
        words = sample_random_words(seed, epoch, indices, 3)
        # Modulo of a 64-bit word by a range of a few hundred: the bias is below 2**-50.
        top = (words[:, 0] % np.uint64(h + 2 * self.padding - ch + 1)).astype(np.int64)
        left = (words[:, 1] % np.uint64(w + 2 * self.padding - cw + 1)).astype(np.int64)
        flip = (words[:, 2] >> np.uint64(63)).astype(bool) if self.hflip else np.zeros(len(indices), bool)
        return AugmentDraws(top, left, flip)

    def apply(self, src: np.ndarray, draws: AugmentDraws, rows: range, out: np.ndarray) -> None:
        """Write the augmented ``src[i]`` to ``out[i]`` for ``i`` in ``rows``."""
        for i in rows:
            self._one(src[i], int(draws.top[i]), int(draws.left[i]), bool(draws.flip[i]), out[i])

    def _one(self, image: np.ndarray, top: int, left: int, flip: bool, out: np.ndarray) -> None:
        h, w, _ = image.shape
        oh, ow, _ = out.shape
        # The window in source coordinates (it may reach into the padding on any side).
        r0, c0 = top - self.padding, left - self.padding
        sr0, sr1 = max(0, r0), min(h, r0 + oh)
        sc0, sc1 = max(0, c0), min(w, c0 + ow)
        dr0, dc0 = sr0 - r0, sc0 - c0
        dr1, dc1 = dr0 + (sr1 - sr0), dc0 + (sc1 - sc0)
        if dr0 > 0 or dc0 > 0 or dr1 < oh or dc1 < ow:
            out.fill(0)  # part of the window is padding
        if sr1 <= sr0 or sc1 <= sc0:
            return
        if flip:
            # Mirrored, output column j comes from window column ow-1-j. Channel by channel: a
            # mirrored (H, W, C) view copied whole runs numpy's inner loop over the C bytes of one
            # pixel, 4x slower than runs along a row (torch.flip is as fast on one thread, but
            # spreads over intra-op threads that the decode threads already keep busy).
            dest, window = out[dr0:dr1, ow - dc1:ow - dc0], image[sr0:sr1, sc0:sc1][:, ::-1]
            for c in range(image.shape[2]):
                np.copyto(dest[:, :, c], window[:, :, c])
        else:
            out[dr0:dr1, dc0:dc1] = image[sr0:sr1, sc0:sc1]
