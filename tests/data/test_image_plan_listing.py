"""An image folder listed from the store's listing (assets/kinds/image_listing.py ``StoreListing``:
names and sizes, nothing downloaded but a manifest) gives the entries, labels, problems and
source descriptions that listing the same files on disk gives, and the same ingest plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from assets.kinds.image_ingest import plan_ingest
from assets.kinds.image_listing import Problems, StoreListing, list_entries
from assets.source import file_sha256
from core.spec import ImageFolder
from pipelines.models.shapes import shapes_dataset
from tests.data.test_images import write_files

CLASS_FOLDERS = {  # the good, and one of each problem the listing finds from names alone
    "shapes/circle/a.jpg": b"a" * 11, "shapes/circle/b.png": b"b" * 12, "shapes/square/c.jpg": b"c" * 13,
    "shapes/triangle/d.jpg": b"d" * 14, "shapes/square/notes.txt": b"n", "shapes/loose.jpg": b"l",
    "shapes/hexagon/e.jpg": b"e" * 15, "elsewhere/f.jpg": b"f",
}
MANIFEST = "path,label\ncircle/a.jpg,circle\nsquare/c.jpg,square\nsquare/c.jpg,square\ntriangle/d.jpg,oval\n" \
           "missing.jpg,circle\n"


def _spec(manifest: str | None = None):
    return dataclasses.replace(shapes_dataset, source=ImageFolder(root="shapes", manifest=manifest, files_per_part=2))


def _listed(spec, files, root) -> tuple[list, list[str], int, dict]:
    problems, sources = Problems(spec.source.root), {}
    entries = list_entries(spec, files, root, problems, sources)
    return [(e.id, e.label, e.label_ok, e.source_key, e.path) for e in entries], *problems.found(), sources


@pytest.mark.parametrize("manifest", [None, "labels.csv"], ids=["class-folders", "manifest"])
def test_the_stores_listing_lists_and_plans_as_the_files_on_disk_do(tmp_path, manifest):
    spec = _spec(manifest)
    root = tmp_path / "sources"
    content = {**CLASS_FOLDERS, **({f"shapes/{manifest}": MANIFEST.encode()} if manifest else {})}
    files = write_files(root, content)
    fetched: list[str] = []

    def fetch(name: str) -> Path:  # the download: the file is already where it would land
        fetched.append(name)
        return root / name

    listing = StoreListing(tuple((p.relative_to(root).as_posix(), p.stat().st_size) for p in files), fetch)
    on_disk, from_store = _listed(spec, files, root), _listed(spec, listing, root)
    assert from_store == on_disk
    assert fetched == ([f"shapes/{manifest}"] if manifest else [])  # no image fetched
    problems = "\n".join(on_disk[1])
    for expected in (("missing.jpg", "listed twice", "'oval'") if manifest else ("hexagon", "loose.jpg")):
        assert expected in problems, problems
    assert "notes.txt" in problems and "elsewhere/f.jpg" in problems

    hashes = {p.relative_to(root).as_posix(): file_sha256(p) for p in files}
    assert plan_ingest(spec, listing, root, hashes=hashes) == plan_ingest(spec, files, root)


def test_an_empty_class_folder_on_disk_is_reported_and_a_store_has_none(tmp_path):
    spec = _spec()
    root = tmp_path / "sources"
    files = write_files(root, {"shapes/circle/a.jpg": b"a", "shapes/square/b.jpg": b"b", "shapes/triangle/c.jpg": b"c"})
    (root / "shapes" / "oval").mkdir()
    listing = StoreListing(tuple((p.relative_to(root).as_posix(), 1) for p in files), lambda name: root / name)
    assert any("oval/: class folder is empty" in m for m in _listed(spec, files, root)[1])
    assert not _listed(spec, listing, root)[1]
