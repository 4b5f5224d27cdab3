"""The store's source files' sha256 taken from the newest version's record (assets/source_hashes.py),
on the lakeFS-API test server: a file is downloaded and hashed only when its name, size or
checksum differ from what that version read, and the data key is the one a full read gives.

The server counts the bytes it sends by object path, so "not downloaded" is the server's word.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from assets.data_key import data_key
from assets.source_hashes import published_hashes, read_sources, record_bytes, record_path, source_data_key
from assets.source_place import describe_files, locate_sources
from core.datasets import dataset_tag
from core.spec import ImageFolder
from pipelines.models.shapes import shapes_dataset
from pipelines.sources import add_source_files, plan_uploads
from tests.data.test_image_plan_on_lakefs import LakeFSPlatform
from tests.data.test_text_parts import _txt_corpus
from tests.data.test_text_steps import _spec as text_spec
from tests.pipeline.conftest import failure_messages
from tests.support.lakefs_server import LakeFSTestServer

SPEC = dataclasses.replace(shapes_dataset, source=ImageFolder(root="shapes"))


@pytest.fixture
def server(tmp_path: Path):
    with LakeFSTestServer(tmp_path / "lakefs") as server:
        yield server


def _write(folder: Path, files: dict[str, bytes]) -> Path:
    for rel, content in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(content)
    return folder


def _publish_record(store, read) -> None:
    """What a published version leaves: its record on main, and a dataset tag on that commit."""
    branch = "record"
    store.create_branch(branch, "main")
    store.put_object(branch, record_path(SPEC.name), record_bytes(read.record))
    store.commit(branch, "a version's record")
    store.merge(branch, "main", "publish")
    store.create_tag(dataset_tag(SPEC.name, 1), "main")


def _full_read(store, tmp: Path) -> list[dict]:
    """Every source file downloaded and described: what a run read before the record."""
    place = locate_sources(SPEC, store, tmp / "no-local", store.resolve_ref("main"))
    root = tmp / "full"
    files = [store.download(place.commit, o.path, root / o.path.removeprefix("sources/")) for o in place.objects]
    return describe_files(files, root)


def test_only_new_and_changed_files_are_downloaded_and_the_key_is_a_full_reads(server, tmp_path):
    lake = LakeFSPlatform(server, tmp_path / "platform")
    store = lake.store()
    store.ensure_repository()
    given = _write(tmp_path / "given" / "shapes", {
        "circle/a.jpg": b"a" * 100, "circle/b.jpg": b"b" * 200, "square/c.jpg": b"c" * 300, "square/d.jpg": b"d" * 50})
    add_source_files(store, SPEC, plan_uploads(SPEC, [given]))

    # no version yet: every file is read, and the record names each one's size, checksum and sha256
    first = read_sources(SPEC, store, locate_sources(SPEC, store, tmp_path / "none", store.resolve_ref("main")),
                         tmp_path / "one")
    assert set(first.fetched) == {f"shapes/{n}" for n in ("circle/a.jpg", "circle/b.jpg", "square/c.jpg",
                                                         "square/d.jpg")}
    listed = {o.path.removeprefix("sources/"): o for o in store.list_objects("main", prefix="sources/")}
    assert first.record == {d["file"]: {"bytes": d["bytes"], "checksum": listed[d["file"]].checksum,
                                        "sha256": d["sha256"]} for d in first.described}
    _publish_record(store, first)
    assert published_hashes(store, SPEC.name) == first.record

    # b rewritten with the same size (only its checksum tells), c grown, e new; a and d as they were
    changed = _write(tmp_path / "changed" / "shapes", {
        "circle/b.jpg": b"B" * 200, "square/c.jpg": b"c" * 301, "square/e.jpg": b"e" * 70})
    add_source_files(store, SPEC, plan_uploads(SPEC, [changed]))
    before = dict(server.bytes_served)
    place = locate_sources(SPEC, store, tmp_path / "none", store.resolve_ref("main"))
    second = read_sources(SPEC, store, place, tmp_path / "two")

    sent = {p: n - before.get(p, 0) for p, n in server.bytes_served.items() if n > before.get(p, 0)}
    assert sent.pop(record_path(SPEC.name)) == len(record_bytes(first.record))  # the record, and of the files:
    assert sent == {"sources/shapes/circle/b.jpg": 200, "sources/shapes/square/c.jpg": 301,
                    "sources/shapes/square/e.jpg": 70}
    assert set(second.fetched) == {"shapes/circle/b.jpg", "shapes/square/c.jpg", "shapes/square/e.jpg"}
    full = _full_read(store, tmp_path)
    assert second.described == full  # the same entries, so the same key
    assert data_key(SPEC, second.described) == data_key(SPEC, full)
    was = {d["file"]: d["sha256"] for d in first.described}
    now = {d["file"]: d["sha256"] for d in second.described}
    assert now["shapes/circle/b.jpg"] != was["shapes/circle/b.jpg"]  # re-hashed, not taken from the record
    assert now["shapes/circle/a.jpg"] == was["shapes/circle/a.jpg"]

    # python -m pipelines train's comparison reads through the same record, and agrees
    before = dict(server.bytes_served)
    key, _ = source_data_key(SPEC, store, tmp_path / "none")
    assert key == data_key(SPEC, full)
    sent = {p: n - before.get(p, 0) for p, n in server.bytes_served.items() if n > before.get(p, 0)}
    assert sum(n for p, n in sent.items() if p.startswith("sources/")) == 200 + 301 + 70


def test_a_record_that_does_not_match_the_listing_is_not_trusted(server, tmp_path):
    """A file whose recorded checksum or size is not the store's is read: a record of other bytes
    (another store, a hand edit) can cost a download, never a wrong key."""
    lake = LakeFSPlatform(server, tmp_path / "platform")
    store = lake.store()
    store.ensure_repository()
    add_source_files(store, SPEC, plan_uploads(SPEC, [_write(tmp_path / "given" / "shapes", {
        "circle/a.jpg": b"a" * 10, "circle/b.jpg": b"b" * 20, "circle/c.jpg": b"c" * 30})]))
    place = locate_sources(SPEC, store, tmp_path / "none", store.resolve_ref("main"))
    first = read_sources(SPEC, store, place, tmp_path / "one")
    wrong = {**first.record,
             "shapes/circle/a.jpg": {**first.record["shapes/circle/a.jpg"], "checksum": "0" * 32, "sha256": "f" * 64},
             "shapes/circle/b.jpg": {**first.record["shapes/circle/b.jpg"], "bytes": 21, "sha256": "f" * 64}}
    _publish_record(store, dataclasses.replace(first, record=wrong))

    second = read_sources(SPEC, store, place, tmp_path / "two")
    assert set(second.fetched) == {"shapes/circle/a.jpg", "shapes/circle/b.jpg"}
    assert second.described == first.described


def test_a_local_folder_is_hashed_where_it_lies_and_records_nothing(server, tmp_path):
    lake = LakeFSPlatform(server, tmp_path / "platform")
    store = lake.store()
    store.ensure_repository()
    root = tmp_path / "sources"
    _write(root / "shapes", {"circle/a.jpg": b"a" * 10, "square/b.jpg": b"b" * 20})
    read = read_sources(SPEC, store, locate_sources(SPEC, store, root, store.resolve_ref("main")), tmp_path / "t")
    files = sorted((root / "shapes").rglob("*.jpg"))
    assert (read.local, read.record, read.fetched) == (files, {}, {})
    assert read.described == describe_files(files, root)


# ---------------------------------------------------------------- a text corpus through its job

def test_a_text_corpus_reused_from_the_store_downloads_no_source_file_and_an_edit_keeps_the_full_reads_key(
        server, tmp_path):
    lake = LakeFSPlatform(server, tmp_path / "platform")
    store = lake.store()
    store.ensure_repository()
    spec = text_spec()
    given = tmp_path / "given"
    for rel, text in _txt_corpus(range(40)).items():
        (given / rel).parent.mkdir(parents=True, exist_ok=True)
        (given / rel).write_text(text)
    lake.upload(spec, given / "toy")
    first, _ = lake.run(spec)
    assert first.success, failure_messages(first)
    record = json.loads(store.get_object("main", record_path("toy")))["files"]
    assert len(record) == 40

    before = lake.sources_sent()
    again, _ = lake.run(spec)
    assert again.success, failure_messages(again)
    assert lake.sources_sent() == before  # reused: not one source byte read to learn it
    assert any(e.asset_key.path[-1] == "raw_dataset" and "reused_dataset_version" in e.materialization.metadata
               for e in again.get_asset_materialization_events())

    (given / "toy" / "doc_0003.txt").write_text("a document rewritten\n")
    (given / "toy" / "doc_0100.txt").write_text("a new document\n")
    lake.upload(spec, given / "toy", only=[given / "toy" / "doc_0003.txt", given / "toy" / "doc_0100.txt"])
    edited, _ = lake.run(spec)
    assert edited.success, failure_messages(edited)
    published = json.loads(store.get_object("main", "datasets/toy/shards/manifest.json"))["data_key"]
    assert published == data_key(spec, describe_files(sorted((given / "toy").glob("*.txt")), given))
    record = json.loads(store.get_object("main", record_path("toy")))["files"]
    assert len(record) == 41 and record["toy/doc_0100.txt"]["bytes"] == len("a new document\n")
