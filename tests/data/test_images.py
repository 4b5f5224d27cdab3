"""Image folders as data (assets/kinds/image*.py): the built-in preprocessing (crop or stretch,
every input mode, EXIF orientation, determinism, the process pool), a user's function and its
code hash; then the dataset pipeline's job run in process: class folders of mixed JPEG/PNG/WebP
published as shapes-d1, a manifest listing the same images in another order giving the same
version, and every kind of bad input refused with the file and the problem named."""

from __future__ import annotations

import dataclasses
import io
import json
import multiprocessing
import random
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from assets.kinds import data_kind
from assets.kinds.image_decode import decode_jpeg, preprocessing_code_sha256
from assets.kinds.image_ingest import RAW_COLUMNS
from assets.kinds.images import IMAGES, ImageKind, preprocess_images
from assets.sharding import SPLITS, assign_splits
from core.datasets import dataset_tags
from core.spec import ImageFolder, ImagePreprocessing, dataset_pipeline
from pipelines.models.shapes import CLASSES, draw_shape, shapes_dataset, write_shapes_source
from tests.pipeline.conftest import Platform, failure_messages
from training_runtime.data.shard_format import ShardColumns, columns_from_manifest

INLINE = ImageKind(workers=0)  # same functions without the pool, for unit tests that need no processes


def encode(img: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **options)
    return out.getvalue()


def three_bands(size=(40, 20)) -> Image.Image:
    """Red left quarter, green middle half, blue right quarter."""
    w, h = size
    arr = np.zeros((h, w, 3), np.uint8)
    arr[:, : w // 4] = (255, 0, 0)
    arr[:, w // 4: 3 * w // 4] = (0, 255, 0)
    arr[:, 3 * w // 4:] = (0, 0, 255)
    return Image.fromarray(arr)


def pixels(data: bytes, **prep) -> np.ndarray:
    return preprocess_images([data], ImagePreprocessing(**prep), workers=0)[0]


def image_spec(name: str, *, prep: ImagePreprocessing | None = None, samples_per_shard: int = 8, **source):
    return dataset_pipeline(name, source=ImageFolder(root=name, **source), classes=CLASSES,
                            preprocessing=prep or ImagePreprocessing(size=(16, 16)),
                            split={"samples_per_shard": samples_per_shard})


def write_files(folder: Path, files: dict[str, bytes]) -> list[Path]:
    for rel, content in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(content)
    return sorted(p for p in folder.rglob("*") if p.is_symlink() or p.is_file())


# --- preprocessing --------------------------------------------------------------------------------

def test_center_crop_keeps_the_middle_and_resize_stretches_the_whole_image():
    data = encode(three_bands((80, 20)), "PNG")  # the middle 20x20 lies well inside the green half

    cropped = pixels(data, size=(10, 10), fit="center_crop")
    stretched = pixels(data, size=(10, 10), fit="resize")

    assert cropped.shape == stretched.shape == (10, 10, 3)
    assert (cropped[:, :, 1] == 255).all() and (cropped[:, :, [0, 2]] == 0).all()  # only the green middle
    assert tuple(stretched[5, 0]) == (255, 0, 0) and tuple(stretched[5, 9]) == (0, 0, 255)


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "P", "P_transparent"])
@pytest.mark.parametrize("channels", ["RGB", "L"])
def test_every_input_mode_becomes_the_declared_channels(mode, channels):
    base = Image.new("RGB", (12, 12), (200, 40, 40))
    if mode == "L":
        img, want = Image.new("L", (12, 12), 90), (90, 90, 90)
    elif mode == "RGB":
        img, want = base, (200, 40, 40)
    elif mode == "RGBA":  # fully transparent: composited on white, whatever colour hides under it
        img, want = Image.new("RGBA", (12, 12), (200, 40, 40, 0)), (255, 255, 255)
    elif mode == "P":
        img, want = base.convert("P", palette=Image.Palette.ADAPTIVE), (200, 40, 40)
    else:
        img = base.convert("P", palette=Image.Palette.ADAPTIVE)
        img.info["transparency"] = img.getpixel((0, 0))
        want = (255, 255, 255)
    out = pixels(encode(img, "PNG"), size=(6, 6), channels=channels)
    if channels == "RGB":
        assert out.shape == (6, 6, 3) and (out == np.array(want, np.uint8)).all()
    else:
        luma = round(want[0] * 299 / 1000 + want[1] * 587 / 1000 + want[2] * 114 / 1000)
        assert out.shape == (6, 6, 1) and (abs(out.astype(int) - luma) <= 1).all()


def test_exif_orientation_is_applied():
    """Stored sideways (vertical bands), shown upright: orientation 6 turns it 90 degrees clockwise."""
    exif = Image.Exif()
    exif[0x0112] = 6
    out = pixels(encode(three_bands((40, 20)), "PNG", exif=exif), size=(40, 20), fit="resize")
    assert out.shape == (40, 20, 3)
    assert tuple(out[0, 10]) == (255, 0, 0) and tuple(out[20, 10]) == (0, 255, 0) and tuple(out[39, 10]) == (0, 0, 255)


def test_a_large_jpeg_decoded_at_a_smaller_dct_scale_matches_a_full_decode():
    """Big photos are decoded at 1/2..1/8 scale (still at least the target size): same picture."""
    y, x = np.mgrid[0:300, 0:400]
    arr = np.stack([x * 255 // 400, y * 255 // 300, (x + y) * 255 // 700], axis=-1).astype(np.uint8)
    data = encode(Image.fromarray(arr), "JPEG", quality=95)
    full = Image.open(io.BytesIO(data)).convert("RGB").resize((32, 32), Image.Resampling.BILINEAR,
                                                              box=(50, 0, 350, 300))

    out = pixels(data, size=(32, 32))

    assert np.abs(out.astype(int) - np.asarray(full, dtype=int)).mean() < 2


def test_preprocessing_is_deterministic_and_the_pool_gives_what_one_process_gives():
    rng = np.random.default_rng(3)
    images = [encode(draw_shape(k, rng, 40), fmt) for k in CLASSES for fmt in ("JPEG", "PNG", "WEBP")] * 3
    prep = ImagePreprocessing(size=(24, 20))

    pooled = preprocess_images(images, prep, workers=2)

    assert pooled.shape == (27, 24, 20, 3) and pooled.dtype == np.uint8
    assert np.array_equal(pooled, preprocess_images(images, prep, workers=0))
    jpegs = preprocess_images(images, dataclasses.replace(prep, encoded=True, jpeg_quality=80), workers=2)
    assert jpegs == preprocess_images(images, dataclasses.replace(prep, encoded=True, jpeg_quality=80), workers=0)
    assert decode_jpeg(jpegs[0], "RGB").shape == (24, 20, 3)


@pytest.fixture
def user_functions(tmp_path, monkeypatch):
    """Two versions of a user's preprocessing module, importable by the workers too."""
    package = tmp_path / "user_prep"
    package.mkdir()
    (package / "__init__.py").write_text("")
    body = """
        import numpy as np

        def gray_square(img):
            return np.asarray(img.convert("L").resize((16, 16)), dtype=np.uint8)[:, :, None] // {divisor}

        def wrong_shape(img):
            return np.zeros((3, 3, 1), np.uint8)

        def kill_worker(img):
            import os
            os._exit(3)
        """
    (package / "v1.py").write_text(textwrap.dedent(body.format(divisor=1)))
    (package / "v2.py").write_text(textwrap.dedent(body.format(divisor=2)))
    monkeypatch.syspath_prepend(str(tmp_path))
    return package


def test_a_user_function_replaces_the_builtin_and_its_code_is_in_the_manifest(user_functions, tmp_path):
    rng = np.random.default_rng(5)
    files = {f"{k}/{k}-{i}.png": encode(draw_shape(k, rng, 32), "PNG") for k in CLASSES for i in range(4)}
    root = tmp_path / "sources"
    paths = write_files(root / "pics", files)

    spec = image_spec("pics", prep=ImagePreprocessing(size=(16, 16), channels="L"), samples_per_shard=100)
    raw = INLINE.ingest(spec, paths, root, tmp_path / "raw")
    assert raw.report.passed, raw.report.failures

    def manifest_with(function, kind):
        prep = dataclasses.replace(spec.preprocessing, function=function)
        out = tmp_path / f"shards-{function}"
        return kind.shard(dataclasses.replace(spec, preprocessing=prep), raw.path, out), out

    v1, out1 = manifest_with("user_prep.v1:gray_square", IMAGES)  # the workers import the user's module
    v2, _ = manifest_with("user_prep.v2:gray_square", INLINE)
    builtin, _ = manifest_with(None, INLINE)

    codes = {m["preprocessing"]["code_sha256"] for m in (v1, v2, builtin)}
    assert len(codes) == 3  # a changed function is new data
    assert v1["preprocessing"]["function"] == "user_prep.v1:gray_square"
    entry = v1["splits"]["train"]["shards"][0]
    shard = ShardColumns(out1 / entry["path"], entry, columns_from_manifest(v1))
    first = shard.value("id", 0).decode()
    want = np.asarray(Image.open(io.BytesIO(files[first])).convert("L").resize((16, 16)))[:, :, None]
    assert np.array_equal(shard.arrays["image"][0], want)


def test_a_user_function_that_cannot_be_imported_or_returns_the_wrong_shape_is_a_clear_error(user_functions):
    children = set(multiprocessing.active_children())
    data = [encode(Image.new("RGB", (20, 20), "red"), "PNG")] * 3
    with pytest.raises(ValueError, match="cannot import module 'user_prep.missing'"):
        preprocess_images(data, ImagePreprocessing(size=(16, 16), function="user_prep.missing:fn"), workers=2)
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        preprocess_images(data, ImagePreprocessing(size=(16, 16), function="user_prep.v1:nope"), workers=0)
    with pytest.raises(ValueError, match=r"returned uint8 \(3, 3, 1\) for image '#0'; expected uint8 \(16, 16, 1\)"):
        preprocess_images(data, ImagePreprocessing(size=(16, 16), channels="L",
                                                   function="user_prep.v1:wrong_shape"), workers=2)
    with pytest.raises(ValueError, match="cannot read its source"):
        preprocessing_code_sha256(ImagePreprocessing(function="builtins:len"), len)
    assert set(multiprocessing.active_children()) <= children  # the pools that failed left no worker behind


def test_a_worker_that_dies_stops_the_pool_with_an_error_and_leaves_no_process(user_functions):
    children = set(multiprocessing.active_children())
    data = [encode(Image.new("RGB", (20, 20), "red"), "PNG")] * 3
    with pytest.raises(RuntimeError, match="an image worker process died"):
        preprocess_images(data, ImagePreprocessing(size=(16, 16), function="user_prep.v1:kill_worker"), workers=2)
    assert set(multiprocessing.active_children()) <= children


def test_shards_are_deterministic_and_their_checks_catch_a_changed_file_a_wrong_size_and_a_class_absent(tmp_path):
    rng = np.random.default_rng(4)
    files = {f"{k}/{k}-{i}.jpg": encode(draw_shape(k, rng, 32), "JPEG") for k in CLASSES for i in range(10)}
    root = tmp_path / "sources"
    paths = write_files(root / "pics", files)
    spec = image_spec("pics", prep=ImagePreprocessing(size=(16, 12), encoded=True, jpeg_quality=85),
                      samples_per_shard=6)
    raw = INLINE.ingest(spec, paths, root, tmp_path / "raw")
    out = tmp_path / "shards"

    manifest = INLINE.shard(spec, raw.path, out)

    assert IMAGES.shard(spec, raw.path, tmp_path / "again") == manifest  # the pool's shards, byte for byte
    assert manifest["columns"][0] == {"name": "jpeg", "kind": "bytes", "role": "input"}
    assert sum(s["num_samples"] for s in manifest["splits"].values()) == 30
    assert INLINE.check_shards(spec, manifest, out).passed
    entry = manifest["splits"]["train"]["shards"][0]
    changed = bytearray((out / entry["path"]).read_bytes())
    changed[-1] ^= 1
    (out / entry["path"]).write_bytes(bytes(changed))
    claimed = {**manifest, "sample_shape": [8, 8, 3], "class_names": [*CLASSES, "hexagon"]}

    failures = "\n".join(INLINE.check_shards(spec, claimed, out).failures)

    assert f"{entry['path']}: sha256 " in failures and "differs from its manifest entry" in failures
    assert "decodes to (16, 12, 3), declared (8, 8, 3)" in failures
    assert "class 'hexagon' (label 3) has no sample in the train split" in failures


def test_pixel_shards_hold_every_image_once_in_id_order_across_shard_boundaries(tmp_path):
    # tasks of 14 images (27 over 2 workers) into shards of 4: a task's run of one split's
    # samples is copied into its shards in blocks, so blocks cross shard ends
    rng = np.random.default_rng(5)
    files = {f"{k}/{k}-{i}.png": encode(draw_shape(k, rng, 24), "PNG") for k in CLASSES for i in range(9)}
    root = tmp_path / "sources"
    paths = write_files(root / "pics", files)
    spec = image_spec("pics", prep=ImagePreprocessing(size=(8, 8)), samples_per_shard=4)
    raw = INLINE.ingest(spec, paths, root, tmp_path / "raw")

    manifest = IMAGES.shard(spec, raw.path, tmp_path / "shards")

    assert INLINE.shard(spec, raw.path, tmp_path / "inline") == manifest
    columns = columns_from_manifest(manifest)
    expected = dict(zip(sorted(files), assign_splits(pd.Series(sorted(files)), spec.split.seed,
                                                    (spec.split.train, spec.split.validation, spec.split.test))))
    seen = []
    for code, split in enumerate(SPLITS):
        shards = [ShardColumns(tmp_path / "shards" / e["path"], e, columns) for e in manifest["splits"][split]["shards"]]
        assert [s.num_samples for s in shards[:-1]] == [4] * (len(shards) - 1) and 0 < shards[-1].num_samples <= 4
        ids = [s.value("id", i).decode() for s in shards for i in range(s.num_samples)]
        assert ids == sorted(ids) and all(expected[i] == code for i in ids), split
        images = np.concatenate([np.array(s.arrays["image"]) for s in shards])
        for image_id, image in zip(ids, images):
            assert np.array_equal(image, pixels(files[image_id], size=(8, 8))), image_id
        seen += ids
    assert sorted(seen) == sorted(files)


def test_ingest_reads_a_parquet_manifest_and_links_inside_the_sources_root(tmp_path):
    rng = np.random.default_rng(2)
    root = tmp_path / "sources"
    files = {f"all/{k}-{i}.webp": encode(draw_shape(k, rng, 24), "WEBP") for k in CLASSES for i in range(2)}
    write_files(root / "pics", files)
    shared = root / "elsewhere" / "extra.png"  # inside the sources root, outside the image folder
    shared.parent.mkdir()
    shared.write_bytes(encode(draw_shape("circle", rng, 24), "PNG"))
    (root / "pics" / "all" / "linked.png").symlink_to(shared)
    rows = [(rel, rel.split("-")[0].removeprefix("all/")) for rel in files] + [("all/linked.png", "circle")]
    pd.DataFrame(rows, columns=["file", "class"]).to_parquet(root / "pics" / "labels.parquet")
    spec = image_spec("pics", manifest="labels.parquet", path_column="file", label_column="class")
    paths = sorted(p for p in (root / "pics").rglob("*") if p.is_symlink() or p.is_file())

    raw = INLINE.ingest(spec, paths, root, tmp_path / "raw")

    assert raw.report.passed, raw.report.failures
    table = pd.read_parquet(raw.path / "images")  # one part: 7 images
    assert tuple(table.columns) == RAW_COLUMNS and raw.rows == 7
    assert list(table["id"]) == sorted(table["id"])  # the raw copy is in id order
    assert table.set_index("id").loc["all/linked.png", "bytes"] == shared.read_bytes()
    assert set(table["format"]) == {"WEBP", "PNG"}
    shares = next(o for o in raw.report.outcomes if o.expectation == "class_shares").observed
    assert shares == {"circle": round(3 / 7, 6), "square": round(2 / 7, 6), "triangle": round(2 / 7, 6)}
    assert data_kind(spec) is IMAGES


# --- the dataset pipeline's job -------------------------------------------------------------------

def mixed_shapes(folder: Path) -> dict[str, bytes]:
    """The shapes example (JPEG), and PNG and WebP images of every mode added to its class folders."""
    write_shapes_source(folder.parent, per_class=10, seed=1)
    rng = np.random.default_rng(7)
    extra = {}
    for k in CLASSES:
        for i, (fmt, ext, mode) in enumerate([("PNG", "png", "L"), ("PNG", "png", "RGBA"), ("PNG", "png", "P"),
                                              ("WEBP", "webp", "RGB"), ("JPEG", "jpeg", "L")]):
            img = draw_shape(k, rng, 48 + 8 * i)
            img = img.convert(mode, palette=Image.Palette.ADAPTIVE) if mode == "P" else img.convert(mode)
            extra[f"{k}/extra-{i}.{ext}"] = encode(img, fmt)
    write_files(folder, extra)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def read_shards(store, manifest: dict, tmp: Path) -> dict[str, tuple[list[str], np.ndarray, np.ndarray]]:
    """split -> (ids, labels, images) read back from main as the loader reads them."""
    columns = columns_from_manifest(manifest)
    out = {}
    for split, info in manifest["splits"].items():
        ids, labels, images = [], [], []
        for entry in info["shards"]:
            path = store.download("main", "datasets/shapes/shards/" + entry["path"], tmp / entry["path"])
            shard = ShardColumns(path, entry, columns)
            ids += [shard.value("id", i).decode() for i in range(shard.num_samples)]
            labels.append(np.array(shard.arrays["label"]))
            images.append(np.array(shard.arrays["image"]))
        out[split] = (ids, np.concatenate(labels), np.concatenate(images))
    return out


def test_an_image_folder_is_published_as_shards_and_the_same_images_by_a_manifest_are_the_same_shards(platform):
    folder = platform.sources / "shapes"
    files = mixed_shapes(folder)
    spec = dataclasses.replace(shapes_dataset, split=dataclasses.replace(shapes_dataset.split, samples_per_shard=16))
    store = platform.store()

    first = platform.run(spec)

    assert first.success, failure_messages(first)
    assert set(dataset_tags(store, "shapes")) == {1} and "shapes-d1" in store.list_tags()
    manifest = json.loads(store.get_object("main", "datasets/shapes/shards/manifest.json"))
    assert manifest["preprocessing"]["size"] == [64, 64] and manifest["columns"][0]["shape"] == [64, 64, 3]
    shards = read_shards(store, manifest, platform.root / "read")
    assert sum(len(ids) for ids, _, _ in shards.values()) == len(files) == 45
    for split, (ids, labels, images) in shards.items():
        assert ids == sorted(ids), split
        assert [CLASSES[i] for i in labels] == [i.split("/")[0] for i in ids]
        assert np.array_equal(images, preprocess_images([files[i] for i in ids], spec.preprocessing, workers=0))
    assert all(len(e["path"]) and e["num_samples"] <= 16 for s in manifest["splits"].values() for e in s["shards"])

    # The same images listed by a manifest, in another order: a source declared otherwise, so the run
    # makes its shards again (they hold the same samples) and, as a version names one commit, tags d2.
    rows = [(rel, rel.split("/")[0]) for rel in files]
    random.Random(0).shuffle(rows)
    pd.DataFrame(rows, columns=["path", "label"]).to_csv(folder / "labels.csv", index=False)
    by_manifest = dataclasses.replace(spec, source=ImageFolder(root="shapes", manifest="labels.csv"))

    second = platform.run(by_manifest)

    assert second.success, failure_messages(second)
    tags = dataset_tags(store, "shapes")
    assert set(tags) == {1, 2} and tags[1] != tags[2]
    again = json.loads(store.get_object("main", "datasets/shapes/shards/manifest.json"))
    assert again["splits"] == manifest["splits"]


# --- bad inputs -----------------------------------------------------------------------------------

def tiny_images(folder: Path) -> None:
    """A valid folder: four small images per class."""
    rng = np.random.default_rng(11)
    write_files(folder, {f"{k}/{k}-{i}.png": encode(draw_shape(k, rng, 20), "PNG") for k in CLASSES for i in range(4)})


def png_bomb(pixels_over_limit: float) -> bytes:
    """A 1-bit PNG of a few KB whose pixel count is ``pixels_over_limit`` x Pillow's default bomb limit."""
    side = int((Image.MAX_IMAGE_PIXELS * pixels_over_limit) ** 0.5) + 1
    return encode(Image.new("1", (side, side)), "PNG")


def _add(rel: str, make):
    return lambda folder, platform: write_files(folder, {rel: make()})


def _jpeg(size=(20, 20), mode="RGB", **options) -> bytes:
    return encode(Image.new("RGB", size, (10, 120, 200)).convert(mode), "JPEG", **options)


def _bombs(folder, platform):
    write_files(folder, {"circle/bomb.png": png_bomb(1.01), "square/bigger-bomb.png": png_bomb(2.01)})


def _sizes(folder, platform):
    write_files(folder, {"circle/tiny.jpg": _jpeg((4, 30)), "circle/big.jpg": _jpeg((40, 24))})


def _truncated(folder, platform):
    write_files(folder, {"circle/cut.jpg": encode(draw_shape("circle", np.random.default_rng(0), 96), "JPEG")[:2500]})


def _corrupt(folder, platform):
    data = bytearray(_jpeg())
    data[20:60] = bytes(40)  # the quantisation tables
    write_files(folder, {"square/broken.jpg": bytes(data)})


def _link_outside(folder, platform):
    outside = platform.root / "outside.png"
    outside.write_bytes(encode(Image.new("RGB", (20, 20)), "PNG"))
    (folder / "circle" / "escape.png").symlink_to(outside)


def _manifest(extra_rows):
    def write(folder, platform):
        rows = [(p.relative_to(folder).as_posix(), p.parent.name) for p in sorted(folder.rglob("*.png"))]
        pd.DataFrame(rows + extra_rows, columns=["path", "label"]).to_csv(folder / "labels.csv", index=False)
    return write


def _relabel(folder, platform):
    _manifest([])(folder, platform)
    frame = pd.read_csv(folder / "labels.csv")
    frame.loc[frame["path"] == "square/square-2.png", "label"] = "hexagon"
    frame.to_csv(folder / "labels.csv", index=False)


def _empty_class(folder, platform):
    for p in (folder / "square").iterdir():
        p.unlink()


# (case, change to the valid folder, source options, fragment(s) of the failure message)
CASES = [
    ("corrupt_jpeg", _corrupt, {}, "bad/square/broken.jpg: is corrupt"),
    ("truncated_jpeg", _truncated, {}, "bad/circle/cut.jpg: is corrupt or truncated: OSError: image file is truncated"),
    ("zero_bytes", _add("triangle/empty.png", lambda: b""), {}, "bad/triangle/empty.png: is empty (0 bytes)"),
    ("png_bombs", _bombs, {},  # over Pillow's limit (its warning), and over twice the limit (its error)
     ("bad/circle/bomb.png: is a decompression bomb", "bad/square/bigger-bomb.png: is a decompression bomb")),
    ("png_named_jpg", _add("square/wrong.jpg", lambda: encode(Image.new("RGB", (20, 20)), "PNG")), {},
     "bad/square/wrong.jpg: has the extension '.jpg' (JPEG) but holds a PNG image"),
    ("unlisted_extension", _add("square/notes.txt", lambda: b"not an image"), {},
     "bad/square/notes.txt: has an extension not in the accepted extensions"),
    ("link_outside_sources", _link_outside, {}, "bad/circle/escape.png: is a link to"),
    ("manifest_names_missing_file", _manifest([("circle/ghost.png", "circle")]), {"manifest": "labels.csv"},
     "bad/labels.csv row 13: bad/circle/ghost.png does not exist"),
    ("manifest_unknown_label", _relabel, {"manifest": "labels.csv"},
     "bad/square/square-2.png: has the label 'hexagon' (manifest row 7), not one of the declared classes"),
    ("undeclared_class_folder", _add("hexagon/h.png", lambda: encode(Image.new("RGB", (20, 20)), "PNG")), {},
     "bad/hexagon/: class folder 'hexagon' (1 image(s)) is not one of the declared classes"),
    ("size_out_of_bounds", _sizes, {"max_side": 32},
     ("bad/circle/tiny.jpg: is 4x30 pixels, smaller than min_side 8",
      "bad/circle/big.jpg: is 40x24 pixels, larger than max_side 32")),
    ("mode_not_accepted", _add("triangle/print.jpg", lambda: _jpeg(mode="CMYK")), {},
     "bad/triangle/print.jpg: has mode 'CMYK', not one of the accepted modes ['L', 'RGB', 'RGBA']"),
    ("empty_class_folder", _empty_class, {}, "bad/square/: class folder is empty"),
]


@pytest.fixture(scope="module")
def shared_platform(tmp_path_factory):
    """One instance and store for the catalogue: every case must leave main as it found it anyway."""
    p = Platform(tmp_path_factory.mktemp("images"))
    with p.instance:
        yield p


@pytest.mark.parametrize("case, change, source, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_the_run_names_the_file_and_leaves_main_alone(shared_platform, case, change, source, message):
    platform = shared_platform
    folder = platform.sources / "bad"
    if folder.exists():
        shutil.rmtree(folder)
    tiny_images(folder)
    change(folder, platform)
    spec = image_spec("bad", **source)
    store = platform.store()
    store.ensure_repository()
    main_before = store.resolve_ref("main")

    result = platform.run(spec)

    assert not result.success
    messages = (message,) if isinstance(message, str) else message
    assert all(m in failure_messages(result) for m in messages), failure_messages(result)
    assert store.resolve_ref("main") == main_before and not store.list_objects("main", prefix="datasets/")
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "raw_expectations" and check.passed is False
    report = json.loads(store.get_object(f"run-{result.run_id}", "datasets/bad/validation/raw_dataset.json"))
    assert report["passed"] is False and all(any(m in f for f in report["failures"]) for m in messages)
    assert not store.exists(f"run-{result.run_id}", "datasets/bad/raw/parts.json")
