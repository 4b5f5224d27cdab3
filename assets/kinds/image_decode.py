"""One image at a time: what ingest checks in a file, and how the shards asset turns it into a sample.

Everything here runs in the worker processes of ``image_pool`` (and inline when asked), so it
imports only numpy, Pillow and simplejpeg. Pillow's two process-wide settings that decide what
is refused (the decompression-bomb limit, and whether a truncated file is an error) are set for
each image from what the caller handed over (``pillow_limits``), not taken from the worker.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import io
import json
import math
import struct
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from core.spec import ImagePreprocessing

# What each extension promises; Pillow calls a multi-picture camera JPEG "MPO".
FORMAT_OF_EXTENSION = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP", ".bmp": "BMP",
                       ".gif": "GIF", ".tif": "TIFF", ".tiff": "TIFF"}
_SAME_FORMAT = {"MPO": "JPEG"}
# What Pillow raises on bytes that are not a whole image of the format they claim.
_BROKEN_IMAGE = (OSError, SyntaxError, EOFError, ValueError, struct.error, zlib.error)
_ORIENTATION_TAG = 0x0112
_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height
BACKGROUND = 255  # transparent pixels are composited on white before any conversion
RESAMPLE = Image.Resampling.BILINEAR


@dataclass(frozen=True)
class ImageInfo:
    """What ingest records of one readable image."""

    width: int
    height: int
    mode: str  # the mode it is preprocessed from: palette images count as RGB or RGBA
    format: str  # JPEG, PNG, WEBP ...
    sha256: str


def image_format(img: Image.Image) -> str:
    return _SAME_FORMAT.get(img.format or "", img.format or "unknown")


def effective_mode(img: Image.Image) -> str:
    """Palette images are converted on load: to RGBA when they carry transparency, else RGB."""
    if img.mode == "PA" or (img.mode == "P" and "transparency" in img.info):
        return "RGBA"
    return "RGB" if img.mode == "P" else img.mode


@contextmanager
def pillow_limits(max_pixels: int | None) -> Iterator[None]:
    """For the block: Pillow's bomb limit is ``max_pixels`` (the caller's), and a truncated file is an
    error, never grey pixels. The previous settings come back afterwards."""
    saved = Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES
    Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES = max_pixels, False
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES = saved


def open_image(data: bytes) -> Image.Image:
    """Open ``data`` lazily; Pillow's bomb warning is an error here, as its DecompressionBombError is."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data))


def inspect_image(data: bytes, extension: str, max_pixels: int | None) -> tuple[ImageInfo | None, str | None]:
    """(what the image is, None) or (None, the problem, phrased to follow the file's name).

    The image is decoded in full (JPEGs at 1/8 scale: every coded block is still read), so a
    truncated or corrupt file is found here and not halfway through sharding.
    """
    with pillow_limits(max_pixels):
        return _inspect(data, extension, max_pixels)


def _inspect(data: bytes, extension: str, max_pixels: int | None) -> tuple[ImageInfo | None, str | None]:
    try:
        img = open_image(data)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        return None, f"is a decompression bomb: {exc} (limit PIL.Image.MAX_IMAGE_PIXELS = {max_pixels})"
    except UnidentifiedImageError:
        return None, "is not an image Pillow can read (corrupt, or not an image at all)"
    except _BROKEN_IMAGE as exc:
        return None, f"is corrupt: {type(exc).__name__}: {exc}"
    found, promised = image_format(img), FORMAT_OF_EXTENSION.get(extension)
    if promised is None:
        return None, (f"has the extension {extension!r}, which names no image format read here "
                      f"({sorted(FORMAT_OF_EXTENSION)})")
    if found != promised:
        return None, f"has the extension {extension!r} ({promised}) but holds a {found} image"
    width, height = img.size
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            if found == "JPEG":
                img.draft(None, (max(1, width // 8), max(1, height // 8)))
            img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        return None, f"is a decompression bomb: {exc} (limit PIL.Image.MAX_IMAGE_PIXELS = {max_pixels})"
    except _BROKEN_IMAGE as exc:
        return None, f"is corrupt or truncated: {type(exc).__name__}: {exc}"
    return ImageInfo(width, height, effective_mode(img), found, hashlib.sha256(data).hexdigest()), None


# --- preprocessing ------------------------------------------------------------------------------

def channel_count(channels: str) -> int:
    return 1 if channels == "L" else 3


def sample_shape(prep: ImagePreprocessing) -> tuple[int, int, int]:
    """(height, width, channels) of every preprocessed sample."""
    return (*prep.size, channel_count(prep.channels))


def load_function(path: str) -> Callable[[Image.Image], np.ndarray]:
    """The user's ``"package.module:function"``; a clear ValueError when it cannot be imported."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any error of the user's module, re-raised with what was being loaded
        raise ValueError(f"preprocessing.function {path!r}: cannot import module {module_name!r}: "
                         f"{type(exc).__name__}: {exc}") from exc
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ValueError(f"preprocessing.function {path!r}: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ValueError(f"preprocessing.function {path!r} is a {type(fn).__name__}, not a function")
    return fn


def to_channels(img: Image.Image, channels: str) -> Image.Image:
    """Convert to ``channels`` ("RGB" or "L"), compositing transparency on white first."""
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, (BACKGROUND,) * 4), rgba)
    return img if img.mode == channels else img.convert(channels)


def crop_box(size: tuple[int, int], target: tuple[int, int]) -> tuple[float, float, float, float]:
    """The middle region of an image of ``size`` (w, h) with ``target``'s (w, h) aspect ratio."""
    (w, h), (tw, th) = size, target
    if w * th > h * tw:  # wider than the target: keep the full height
        cw = h * tw / th
        return ((w - cw) / 2, 0.0, (w + cw) / 2, float(h))
    ch = w * th / tw
    return (0.0, (h - ch) / 2, float(w), (h + ch) / 2)


def _draft_size(stored: tuple[int, int], target: tuple[int, int], fit: str, transposed: bool) -> tuple[int, int]:
    """The smallest stored-orientation size a JPEG may be decoded at (DCT scaling) and still give
    the region ``fit`` keeps at least ``target`` pixels."""
    shown = stored[::-1] if transposed else stored
    box = crop_box(shown, target) if fit == "center_crop" else (0.0, 0.0, *map(float, shown))
    need = (math.ceil(shown[0] * target[0] / (box[2] - box[0])), math.ceil(shown[1] * target[1] / (box[3] - box[1])))
    return need[::-1] if transposed else need


def builtin_pixels(img: Image.Image, prep: ImagePreprocessing) -> np.ndarray:
    """The built-in preprocessing: upright (EXIF orientation), ``channels``, then ``fit`` to ``size``
    with bilinear (antialiased) resampling. Returns uint8 (height, width, channels)."""
    height, width = prep.size
    orientation = img.getexif().get(_ORIENTATION_TAG, 1)
    if image_format(img) == "JPEG":  # decode at the smallest DCT scale that still covers the target
        img.draft(prep.channels, _draft_size(img.size, (width, height), prep.fit, orientation in _TRANSPOSED))
    if orientation != 1:
        img = ImageOps.exif_transpose(img)
    img = to_channels(img, prep.channels)
    box = crop_box(img.size, (width, height)) if prep.fit == "center_crop" else None
    img = img.resize((width, height), RESAMPLE, box=box)
    return np.asarray(img, dtype=np.uint8).reshape(sample_shape(prep))


def checked_output(out, prep: ImagePreprocessing, image_id: str) -> np.ndarray:
    """A user function's result as uint8 (height, width, channels), or a ValueError saying what is wrong."""
    want = sample_shape(prep)
    arr = np.asarray(out)
    if arr.ndim == 2 and want[2] == 1:
        arr = arr[:, :, None]
    if arr.dtype != np.uint8 or arr.shape != want:
        raise ValueError(f"preprocessing.function {prep.function!r} returned {arr.dtype} {arr.shape} for image "
                         f"{image_id!r}; expected uint8 {want} (preprocessing.size and channels)")
    return np.ascontiguousarray(arr)


def preprocess_pixels(data: bytes, prep: ImagePreprocessing, image_id: str, max_pixels: int | None,
                      function: Callable | None = None) -> np.ndarray:
    """One encoded image to its sample's pixels: the user's function when given, else the built-in."""
    with pillow_limits(max_pixels):
        img = open_image(data)
        if function is None:
            return builtin_pixels(img, prep)
        img.load()
        try:
            out = function(img)
        except Exception as exc:  # the user's code: re-raised as a ValueError that names the image
            raise ValueError(f"preprocessing.function {prep.function!r} failed on image {image_id!r}: "
                             f"{type(exc).__name__}: {exc}") from exc
    return checked_output(out, prep, image_id)


def encode_jpeg(pixels: np.ndarray, quality: int) -> bytes:
    """uint8 (h, w, 1 or 3) as a baseline JPEG (libjpeg-turbo via simplejpeg; 4:2:0 for colour)."""
    import simplejpeg

    if pixels.shape[2] == 1:
        return simplejpeg.encode_jpeg(pixels, quality=quality, colorspace="GRAY", colorsubsampling="Gray")
    return simplejpeg.encode_jpeg(pixels, quality=quality, colorspace="RGB", colorsubsampling="420")


def decode_jpeg(data: bytes, channels: str) -> np.ndarray:
    """A JPEG sample back to uint8 (h, w, channels), as a loader reads it."""
    import simplejpeg

    return simplejpeg.decode_jpeg(data, colorspace="GRAY" if channels == "L" else "RGB")


# Functions whose source decides the built-in preprocessing's pixels: part of the data version.
BUILTIN_FUNCTIONS = (to_channels, crop_box, _draft_size, builtin_pixels, encode_jpeg)


def preprocessing_code_sha256(prep: ImagePreprocessing, function: Callable | None) -> str:
    """sha256 of the code that makes the samples and of its parameters: a changed function is new data."""
    try:
        makers = ([function, *([encode_jpeg] if prep.encoded else [])] if function is not None
                  else BUILTIN_FUNCTIONS)
        code = [inspect.getsource(f) for f in makers]
    except (OSError, TypeError) as exc:
        raise ValueError(f"preprocessing.function {prep.function!r}: cannot read its source to version the data "
                         f"it makes ({exc}); define it in a module file") from exc
    params = {"size": list(prep.size), "fit": prep.fit, "channels": prep.channels, "encoded": prep.encoded,
              "jpeg_quality": prep.jpeg_quality, "function": prep.function, "background": BACKGROUND,
              "resample": RESAMPLE.name}
    return hashlib.sha256(json.dumps({"code": code, "params": params}, sort_keys=True).encode()).hexdigest()
