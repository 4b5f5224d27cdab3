"""Decoders for variable-length columns: one sample's bytes into its slot of a preallocated batch.

A decoder has ``shape`` and ``dtype`` (one decoded sample) and is called as ``decoder(data,
out)``. It runs on the typed loader's decode threads, so it must release the GIL while it works:
libjpeg-turbo through simplejpeg does, and so does Pillow's decoding.
"""

from __future__ import annotations

import functools
import io
import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)

JPEG_MAGIC = b"\xff\xd8\xff"


class Decoder(Protocol):
    shape: tuple[int, ...]
    dtype: np.dtype

    def __call__(self, data: bytes, out: np.ndarray) -> None:
        """Decode ``data`` into ``out`` (shape ``shape``, dtype ``dtype``) or raise."""


@functools.cache
def _simplejpeg():
    """simplejpeg, or None where it is not installed (Pillow then decodes JPEGs too, slower;
    said once per process)."""
    try:
        import simplejpeg
    except ImportError:
        log.warning("simplejpeg is not installed: JPEG samples are decoded by Pillow, which is slower; "
                    "pip install simplejpeg")
        return None
    return simplejpeg


_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_JPEG_COLORSPACES = {1: "GRAY", 3: "RGB", 4: "RGBA"}


@dataclass(frozen=True)
class ImageDecoder:
    """Encoded images (JPEG; PNG, WebP and whatever else Pillow reads) into uint8 (height, width,
    channels). JPEGs are decoded by simplejpeg straight into the batch; other formats by Pillow.
    An image of another size is an error: shards store images at one size, and a silent resize
    here would hide a preprocessing bug."""

    height: int
    width: int
    channels: int = 3

    def __post_init__(self) -> None:
        if self.channels not in _PIL_MODES:
            raise ValueError(f"channels {self.channels} is not one of {sorted(_PIL_MODES)}")
        _simplejpeg()  # warn at construction, not on a loader thread, when it is missing

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.height, self.width, self.channels

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    def __call__(self, data: bytes, out: np.ndarray) -> None:
        jpeg = _simplejpeg()
        if jpeg is not None and data[:3] == JPEG_MAGIC:
            got = jpeg.decode_jpeg(data, colorspace=_JPEG_COLORSPACES[self.channels], buffer=out)
        else:
            got = self._decode_with_pillow(data, out)
        if got.shape != self.shape:
            raise ValueError(f"decoded image is {'x'.join(map(str, got.shape))}, the column holds "
                             f"{'x'.join(map(str, self.shape))} (height x width x channels)")

    def _decode_with_pillow(self, data: bytes, out: np.ndarray) -> np.ndarray:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            img = img.convert(_PIL_MODES[self.channels])
            pixels = np.asarray(img)
        pixels = pixels.reshape(*pixels.shape[:2], self.channels)
        if pixels.shape == self.shape:
            out[...] = pixels
        return pixels
