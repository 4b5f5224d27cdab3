"""Where a run reads a pipeline's source files, and the data key of what it finds there.

A dataset reads its relative source paths (``digits/*.csv``, an image folder's root, a corpus'
globs) from one place: the store's ``sources/`` area (at the run's pinned commit, else main's
head) when files there match them, else the local sources folder. Absolute paths (a table's or
a text corpus') are read as they are, from local disk, in either case.

The raw assets (assets/pipeline.py, assets/typed_data.py) read through ``locate_sources`` and
log ``SourcePlace.describe()``, so a run always says which place it read; files of the local
folder that the store's area hides are named there too. The data key a run would compute, for
``python -m pipelines train`` to compare with the published versions before it trains, is
assets/source_hashes.py ``source_data_key``. This module decides only which files are read, not what
their bytes become, so it is not part of the data key's code (``DATA_CODE``).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

from assets.source import SourceError, file_sha256, missing_source_hint, resolve_source_files
from core.spec import ImageFolder, PipelineSpec, TextCorpus
from resources.store.base import ObjectInfo

SOURCES_PREFIX = "sources/"
_GLOB = re.compile(r"[*?\[]")


def store_patterns(spec: PipelineSpec) -> tuple[str, ...]:
    """The relative source patterns: what may be read from the store's ``sources/`` area."""
    return tuple(p for p in (spec.source.paths if spec.source is not None else ()) if not Path(p).is_absolute())


def fixed_folder(pattern: str) -> str:
    """The part of a pattern before its first wildcard, up to its last ``/`` (``digits/`` of ``digits/*.csv``)."""
    fixed = _GLOB.split(pattern, maxsplit=1)[0]
    return fixed.rsplit("/", 1)[0] + "/" if "/" in fixed else ""


def local_folder_files(spec: PipelineSpec, sources_root: Path) -> list[Path]:
    """The files of the local sources folder that the relative paths match (none is no error here).

    Each kind lists as its reader does: an image folder every file and link under its root, a
    corpus with ``Path.glob`` (links listed, not followed), a table with ``glob.glob``."""
    src = spec.source
    if isinstance(src, ImageFolder):
        folder = sources_root / src.root
        return sorted(p for p in folder.rglob("*") if p.is_symlink() or p.is_file()) if folder.is_dir() else []
    patterns = store_patterns(spec)
    if isinstance(src, TextCorpus):
        return sorted({f for p in patterns for f in sources_root.glob(p) if f.is_symlink() or f.is_file()})
    return sorted({Path(m) for p in patterns for m in glob.glob(str(sources_root / p)) if Path(m).is_file()})


def corpus_root(spec: PipelineSpec) -> Path:
    """The folder a corpus of absolute paths names its documents under: the deepest folder that
    holds every pattern's fixed part (``/data/books`` of ``/data/books/*.txt``). Links are read
    only to files inside it."""
    folders = [fixed_folder(p) or "/" for p in spec.source.paths]
    return Path(os.path.commonpath(folders))


def _absolute_files(spec: PipelineSpec) -> list[Path]:
    """The files absolute patterns match (``**`` crosses folders in a corpus' globs)."""
    patterns = [p for p in spec.source.paths if Path(p).is_absolute()]
    return sorted({Path(m) for p in patterns for m in glob.glob(p, recursive=True)
                   if Path(m).is_symlink() or Path(m).is_file()})


@dataclass(frozen=True)
class SourcePlace:
    """What a run of ``pipeline`` reads: the store's files (at ``commit``) or the local folder's,
    plus any absolute paths'; ``hidden``: local-folder files not read because the store's area
    holds files of the pipeline (one place of sources: the store's, once it has them)."""

    pipeline: str
    patterns: tuple[str, ...]  # the relative patterns
    sources_root: Path
    commit: str | None  # the store commit the store's files are read at
    objects: tuple[ObjectInfo, ...] = ()  # the store's files read
    folder_files: tuple[Path, ...] = ()  # the local sources folder's files read (when the store has none)
    absolute: tuple[Path, ...] = ()  # files of absolute paths, read as they are
    hidden: tuple[Path, ...] = ()

    @property
    def in_store(self) -> bool:
        return bool(self.objects)

    def describe(self) -> str:
        """The log line: which place was read, and what the other place holds that is not read."""
        shown = ", ".join(SOURCES_PREFIX + p for p in self.patterns)
        if self.in_store:
            read = [f"{len(self.objects)} file(s) from the store's sources/ area at commit {self.commit[:12]} ({shown})"]
        elif self.patterns:
            read = [f"{len(self.folder_files)} file(s) from the local sources folder {self.sources_root} "
                    f"({', '.join(self.patterns)}); the store's sources/ area holds none of them"]
        else:
            read = []
        if self.absolute:
            read.append(f"{len(self.absolute)} file(s) of its absolute paths, as they are")
        line = f"{self.pipeline}: reading " + " and ".join(read or ["no files"])
        if self.hidden:
            line += (f". The local sources folder also holds {len(self.hidden)} file(s) of these paths "
                     f"({self.hidden[0]}, ...), which are not read: once the store's sources/ area holds a dataset's "
                     f"files, runs read only those. Commit them there too with `python -m pipelines sources add "
                     f"{self.pipeline} FILE...` if they belong to the dataset")
        return line


def locate_sources(spec: PipelineSpec, store, sources_root: Path, commit: str) -> SourcePlace:
    """Where a run at store ``commit`` reads ``spec``'s files (a loader reads no files)."""
    patterns = store_patterns(spec)
    in_store = tuple(o for o in store.list_objects(commit, prefix=SOURCES_PREFIX)
                     if any(fnmatch.fnmatchcase(o.path[len(SOURCES_PREFIX):], p) for p in patterns)) if patterns else ()
    local = local_folder_files(spec, sources_root) if patterns else []
    absolute = tuple(_absolute_files(spec))
    if in_store:
        read = {o.path[len(SOURCES_PREFIX):] for o in in_store}
        hidden = tuple(f for f in local if f.relative_to(sources_root).as_posix() not in read)
        return SourcePlace(spec.name, patterns, sources_root, commit, objects=in_store, absolute=absolute,
                           hidden=hidden)
    return SourcePlace(spec.name, patterns, sources_root, None, folder_files=tuple(local), absolute=absolute)


def typed_source_files(spec: PipelineSpec, store, place: SourcePlace, tmp: Path) -> tuple[list[Path], Path]:
    """An image folder's or a corpus' files to ingest and the root they are named under: the
    store's downloaded to ``tmp``, else the local folder's, else a corpus' absolute paths'.
    SourceError (bad input: retrying cannot help) when there are none."""
    if place.in_store:
        root = tmp / "sources"
        return [store.download(place.commit, o.path, root / o.path[len(SOURCES_PREFIX):]) for o in place.objects], root
    src = spec.source
    if isinstance(src, ImageFolder) and not (place.sources_root / src.root).is_dir():
        raise SourceError(f"pipeline {spec.name!r}: image folder {place.sources_root / src.root} does not exist; put "
                          f"the images under it (one sub-folder per class); or {missing_source_hint(spec)}")
    if place.absolute:
        files, root = list(place.absolute), corpus_root(spec)
    else:
        files, root = list(place.folder_files), place.sources_root
    if not files:
        where = (f"{list(src.paths)}" if place.absolute or not place.patterns
                 else f"{list(place.patterns)} under {place.sources_root} or in the store's sources/ area")
        raise SourceError(f"pipeline {spec.name!r}: no files match {where}; "
                          + (missing_source_hint(spec) if place.patterns else "fix the corpus' absolute paths"))
    return files, root


def describe_files(files: list[Path], root: Path) -> list[dict]:
    """What raw_dataset records about each file it read (symbolic links as the link, not followed)."""
    return [{"file": str(f.relative_to(root)), "bytes": f.lstat().st_size,
             **({"sha256": file_sha256(f)} if f.is_file() and not f.is_symlink() else {})} for f in files]


def table_source_files(spec: PipelineSpec, store, place: SourcePlace, tmp: Path) -> tuple[list[Path], list[dict]]:
    """A table's files (the store's downloaded to ``tmp``) and their descriptions for the data key.
    A pattern that matches nothing is a SourceError naming it."""
    if not place.in_store:
        files = resolve_source_files(spec, place.sources_root)
        return files, _described_local(files)
    absolute = _absolute_table_files(spec)
    files = [store.download(place.commit, o.path, tmp / o.path) for o in place.objects]
    return files + absolute, _described_store(place.objects) + _described_local(absolute)


def table_descriptions(spec: PipelineSpec, place: SourcePlace) -> list[dict]:
    """``table_source_files``' descriptions without downloading the store's files."""
    if place.in_store:
        return _described_store(place.objects) + _described_local(_absolute_table_files(spec))
    return _described_local(resolve_source_files(spec, place.sources_root))


def _absolute_table_files(spec: PipelineSpec) -> list[Path]:
    """A table's absolute paths, read as they are beside the store's files (a pattern matching
    nothing is the SourceError of ``resolve_source_files``)."""
    absolute = tuple(p for p in spec.source.paths if Path(p).is_absolute())
    return resolve_source_files(spec, Path("/"), patterns=absolute) if absolute else []


def _described_local(files: list[Path]) -> list[dict]:
    return [{"file": f.name, "bytes": f.stat().st_size, "sha256": file_sha256(f)} for f in files]


def _described_store(objects) -> list[dict]:
    return [{"file": o.path, "bytes": o.size_bytes, "checksum": o.checksum} for o in objects]
