"""The sha256 of a dataset's source files, read from the store without reading files the newest
published version already read.

The data key (assets/data_key.py) names each source file by its name, size and sha256, and a run
needs the key before it knows whether it has anything to make. For the store's ``sources/`` area
that used to mean downloading and hashing every file, every run: for a 2 TB image folder, 2 TB
read to learn that 1 % of it changed. A store's listing gives each file's size and the store's
own checksum of its bytes (lakeFS: the object's ETag; the local store: its sha256) without reading
it. So a version records, beside its ``raw/sources.json``, the size and checksum each sha256 was
computed for (``raw/source_hashes.json``), and the next run takes the sha256 of every file whose
name, size and checksum are the newest version's, downloading and hashing only the others (new or
changed files). The entries described are those a full read gives, so the key is too.

A local folder's files (and a corpus' absolute paths) are hashed every run, as before: their bytes
are on local disk, cheap to read next to a download, and the identity local disk offers without
reading them (size and modification time) can lie: a file rewritten within the timestamp's
resolution, or whose time was restored (``cp -p``, ``rsync -t``, ``touch -r``), keeps it. git's
index trusts it only with a guard for such racy timestamps; reading the bytes needs none.

This module decides which bytes are hashed, not what they are, so it is not in the data key's code.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from assets import ingest
from assets.source import file_sha256
from assets.source_place import (SOURCES_PREFIX, SourcePlace, describe_files, locate_sources, table_descriptions,
                                 typed_source_files)
from core.datasets import UnknownDatasetVersionError, dataset_tags
from core.spec import PipelineSpec
from resources.store.base import MAIN, ObjectInfo, RefNotFoundError

RECORD_NAME = "source_hashes.json"
RECORD_VERSION = 1


def record_path(dataset: str) -> str:
    """Where a version records its store files' hashes: beside ``raw/sources.json``."""
    return ingest.dataset_prefix(dataset) + "raw/" + RECORD_NAME


def record_bytes(files: dict[str, dict]) -> bytes:
    """The record as stored: compact, one entry per file (it grows with the folder)."""
    return json.dumps({"version": RECORD_VERSION, "files": files}, sort_keys=True, separators=(",", ":")).encode()


def published_hashes(store, dataset: str) -> dict[str, dict]:
    """The newest published version's record, by file name under ``sources/``: ``{"bytes",
    "checksum", "sha256"}`` each; empty without a version, or for one made before the record."""
    try:
        tags = dataset_tags(store, dataset)
    except UnknownDatasetVersionError:
        return {}  # a store without a repository yet
    if not tags:
        return {}
    try:
        record = json.loads(store.get_object(tags[max(tags)], record_path(dataset)))
    except RefNotFoundError:
        return {}
    return record["files"] if record.get("version") == RECORD_VERSION else {}


@dataclass
class ReadSources:
    """A run's source files, described for the data key.

    ``local``: a local folder's files (or a corpus' absolute paths), read where they lie; for the
    store's files, ``objects`` (their listing at ``commit``), of which ``fetched`` were downloaded
    under ``root`` to hash them (new or changed since the newest version), and ``record``, what the
    version made of them records (``raw/source_hashes.json``). ``fetched`` grows as files are
    downloaded later in the step (``download``), so none is downloaded twice."""

    root: Path
    described: list[dict]
    local: list[Path] = field(default_factory=list)
    commit: str | None = None
    objects: tuple[ObjectInfo, ...] = ()
    fetched: dict[str, Path] = field(default_factory=dict)
    record: dict[str, dict] = field(default_factory=dict)

    @property
    def in_store(self) -> bool:
        return bool(self.objects)

    def name(self, o: ObjectInfo) -> str:
        """A store file's name under the root (its path under ``sources/``), as described."""
        return o.path[len(SOURCES_PREFIX):]

    def download(self, store, name: str) -> Path:
        """A store file here, under the root: fetched once per run."""
        if name not in self.fetched:
            self.fetched[name] = store.download(self.commit, SOURCES_PREFIX + name, self.root / name)
        return self.fetched[name]

    def files(self, store) -> list[Path]:
        """Every file, as the kind's ingest reads them: the store's downloaded (those hashed here
        already are not downloaded again), a local folder's where they lie."""
        return [self.download(store, self.name(o)) for o in self.objects] if self.in_store else list(self.local)


def read_sources(spec: PipelineSpec, store, place: SourcePlace, tmp: Path) -> ReadSources:
    """``place``'s files described as ``describe_files`` describes them: the store's from the
    newest version's record where it covers them, else downloaded under ``tmp`` and hashed; a
    local folder's hashed where they lie. SourceError when there are none (``typed_source_files``)."""
    if not place.in_store:
        files, root = typed_source_files(spec, store, place, tmp)
        return ReadSources(root, describe_files(files, root), local=files)
    read = ReadSources(tmp / "sources", [], commit=place.commit, objects=place.objects)
    known = published_hashes(store, spec.name)
    for o in place.objects:
        name = read.name(o)
        was = known.get(name)
        if was is not None and o.checksum and (was["bytes"], was["checksum"]) == (o.size_bytes, o.checksum):
            size, sha256 = was["bytes"], was["sha256"]
        else:  # new or changed since that version: its bytes are read
            path = read.download(store, name)
            size, sha256 = path.stat().st_size, file_sha256(path)
        read.described.append({"file": name, "bytes": size, "sha256": sha256})
        # the size recorded is the bytes read, so a listing that disagreed with them never matches
        read.record[name] = {"bytes": size, "checksum": o.checksum, "sha256": sha256}
    return read


def source_data_key(spec: PipelineSpec, store, sources_root: Path, commit: str | None = None) -> tuple[dict, str]:
    """(the data key a run of dataset ``spec`` at ``commit`` (main's head) would compute, the
    place it read): the same files, described as the raw asset describes them."""
    from assets.data_key import data_key, frame_sha256
    from assets.kinds import data_kind

    if getattr(spec.source, "loader", None) is not None:  # a table's loader function
        frame = spec.source.loader()
        described = [{"loader": spec.source.describe(), "rows": int(len(frame)), "sha256": frame_sha256(frame)}]
        return data_key(spec, described), f"{spec.name}: calling {spec.source.describe()}"
    place = locate_sources(spec, store, sources_root, commit or store.resolve_ref(MAIN))
    if data_kind(spec) is None:
        return data_key(spec, table_descriptions(spec, place)), place.describe()
    # the store's files that the newest version read are not downloaded again (assets/source_hashes.py)
    with tempfile.TemporaryDirectory(prefix="source-key-") as tmp:
        return data_key(spec, read_sources(spec, store, place, Path(tmp)).described), place.describe()
