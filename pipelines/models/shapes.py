"""Example image data: circles, squares and triangles drawn with Pillow, as a user brings a photo
folder (one sub-folder per class of JPEGs); the dataset pipeline that shards them, and a small
ResNet trained on them with seeded crop-and-flip augmentation."""

from __future__ import annotations

import math
import shutil
import uuid
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from pipelines.api import ImageFolder, ImagePreprocessing, dataset_pipeline, model_pipeline
from training_runtime.atomic_files import fsync_path, replace_durably

ROOT = "shapes"
CLASSES = ("circle", "square", "triangle")
IMAGE_SIDE = 96
JPEG_QUALITY = 97  # with the noise and full-resolution colour (4:4:4), about 20 KB an image
NOISE = 20  # standard deviation of the pixel noise


def draw_shape(kind: str, rng: np.random.Generator, side: int = IMAGE_SIDE) -> Image.Image:
    """One RGB image: a ``kind`` of random size, position, rotation and colour on a random
    background, with pixel noise."""
    background = rng.integers(0, 256, 3)
    colour = (background + rng.integers(80, 176, 3)) % 256  # never too close to the background
    img = Image.new("RGB", (side, side), tuple(int(c) for c in background))
    radius = rng.uniform(0.18, 0.4) * side
    cx, cy = (rng.uniform(radius, side - radius) for _ in range(2))
    fill = tuple(int(c) for c in colour)
    draw = ImageDraw.Draw(img)
    if kind == "circle":
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), fill=fill)
    else:
        corners = 4 if kind == "square" else 3
        turn = rng.uniform(0, 2 * math.pi)
        draw.polygon([(cx + radius * math.cos(turn + 2 * math.pi * k / corners),
                       cy + radius * math.sin(turn + 2 * math.pi * k / corners)) for k in range(corners)], fill=fill)
    noisy = np.asarray(img, dtype=np.int16) + rng.normal(0, NOISE, (side, side, 3)).astype(np.int16)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def write_shapes_source(sources_root: Path, per_class: int = 150, seed: int = 0) -> Path:
    """Write ``per_class`` JPEGs of each class under ``sources_root/shapes/<class>/`` (once).

    The folder is drawn in a temporary folder beside it and renamed into place, so a crash
    mid-way leaves no half-written folder that looks complete."""
    folder = Path(sources_root) / ROOT
    if folder.exists():
        return folder
    rng = np.random.default_rng(seed)
    tmp = folder.parent / f".{ROOT}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        for kind in CLASSES:
            (tmp / kind).mkdir(parents=True)
            for i in range(per_class):
                path = tmp / kind / f"{kind}-{i:04d}.jpg"
                draw_shape(kind, rng).save(path, "JPEG", quality=JPEG_QUALITY, subsampling=0)
                fsync_path(path)
            fsync_path(tmp / kind)
        replace_durably(tmp, folder)
    except OSError:
        if not folder.is_dir():
            raise
        # else another writer renamed its complete folder into place first: that one stays
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


shapes_dataset = dataset_pipeline(
    "shapes",
    source=ImageFolder(root=ROOT),
    classes=CLASSES,
    preprocessing=ImagePreprocessing(size=(64, 64)),
    description="Circles, squares and triangles drawn with Pillow (96x96 JPEGs with noise), cropped to 64x64 "
                "RGB: a small image classification dataset.",
)

shapes_resnet = model_pipeline(
    "shapes_resnet",
    dataset="shapes",
    model="resnet",
    # Each image standardised per channel first (the ResNet's default): shape, not colour, tells
    # the classes apart here. Stem stride 2: 64x64 images cost a quarter as much.
    model_kwargs={"widths": [16, 32, 64], "stem_stride": 2},
    recipe={"epochs": 10, "batch_size": 32, "lr": 0.01, "weight_decay": 0.05, "world_size": 2,
            "checkpoint_every_steps": 40, "augment_padding": 4, "augment_hflip": True},
    # 357 training images from scratch on two CPU cores reach about two thirds (chance: one third).
    gate={"test_accuracy": {"min": 0.5}},
    description="A small ResNet (residual blocks, batch norm) that tells circles, squares and triangles apart; "
                "random crops and flips, the best validation accuracy's weights registered.",
)
