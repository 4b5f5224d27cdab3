"""Source files in the store: where a dataset pipeline reads them, and committing new ones there.

A pipeline's source paths (``Source.paths``, ``TextCorpus.paths``, an ``ImageFolder``'s root) are
read from the store's ``sources/`` area at ``main`` (or at the commit a new-data run is pinned to)
when files there match them, and from the local sources folder (``<data root>/sources``) otherwise
(assets/pipeline.py, assets/typed_data.py). ``add_source_files`` commits files to that area through
the store interface, so it works on the local store and on lakeFS alike, and the pipeline's
new-data sensor sees the commit (pipelines/automation.py).

Where a file goes: beside the files the pipeline already reads. Each pattern's fixed folder
(``digits/`` of ``digits/*.csv``) plus the file's name, or its path inside a folder given whole
(``circle/a.png`` of an image folder), must match one of the pipeline's patterns; ``--to`` names
the place instead (e.g. to replace the one file a fixed source path reads). An image folder read by
class sub-folders takes only images of a declared class in their class's folder: what its run
would refuse is refused here.

One place of sources: a dataset reads its files from the store's area once that holds any of
them, and no longer from the local folder (assets/source_place.py). ``hidden_local_files`` names
the local files an add would hide that way; the ``sources add`` command refuses such an add and
says how to move the folder over with it.
"""

from __future__ import annotations

import fnmatch
import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from assets.source_place import locate_sources, store_patterns
from core.spec import ImageFolder, PipelineSpec
from resources.store.base import MAIN, VersionedStore

SOURCES_PREFIX = "sources/"  # the store's area for source files (assets.pipeline reads it)
_GLOB = re.compile(r"[*?\[]")


class SourceUploadError(ValueError):
    """Files that cannot be committed as this pipeline's sources; the message says what to change."""


@dataclass(frozen=True)
class Upload:
    local: Path
    target: str  # the store path, under sources/


@dataclass(frozen=True)
class Uploaded:
    dataset: str
    paths: tuple[str, ...]
    commit_id: str  # the upload's commit
    main_commit_id: str  # main's head after the merge


def source_patterns(spec: PipelineSpec) -> tuple[str, ...]:
    """The store-relative patterns (under ``sources/``) the pipeline reads its files by."""
    if spec.dataset is not None:
        raise SourceUploadError(f"pipeline {spec.name!r} trains on dataset {spec.dataset!r}'s shards and reads no "
                                f"sources; add the files to {spec.dataset!r}")
    source = spec.source
    paths = source.paths if source is not None else ()  # an ImageFolder's: root/**
    relative = tuple(p for p in paths if not Path(p).is_absolute())
    if not relative:
        what = source.describe() if source is not None else "no source"
        raise SourceUploadError(f"pipeline {spec.name!r} reads {what}, not files under the sources area; only a "
                                "pipeline with relative source paths reads committed source files")
    return relative


def _fixed_folder(pattern: str) -> str:
    fixed = _GLOB.split(pattern, maxsplit=1)[0]
    return fixed.rsplit("/", 1)[0] + "/" if "/" in fixed else ""


def plan_uploads(spec: PipelineSpec, given: list[Path], to: str | None = None) -> list[Upload]:
    """Where each given file (or every file under a given folder) goes in the sources area."""
    patterns = source_patterns(spec)
    files: list[tuple[Path, str, Path]] = []  # (file, its path in the sources area's folder, what was given)
    for path in given:
        if path.is_dir():
            inner = sorted(p for p in path.rglob("*") if p.is_file())
            if not inner:
                raise SourceUploadError(f"folder {path} holds no files")
            files += [(p, p.relative_to(path).as_posix(), path) for p in inner]
        elif path.is_file():
            files.append((path, path.name, path))
        else:
            raise SourceUploadError(f"{path} is neither a file nor a folder")
    shown = ", ".join(SOURCES_PREFIX + p for p in patterns)
    if to is not None:
        if len(files) != 1:
            raise SourceUploadError(f"--to names one place; give one file, not {len(files)}")
        target = to.strip("/").removeprefix(SOURCES_PREFIX)
        if not any(fnmatch.fnmatchcase(target, p) for p in patterns):
            raise SourceUploadError(f"--to {to}: pipeline {spec.name!r} would not read {SOURCES_PREFIX}{target}; "
                                    f"it reads {shown}")
        uploads = [Upload(files[0][0], SOURCES_PREFIX + target)]
        _refuse_unread_images(spec, uploads, {files[0][0]: files[0][0]})
        return uploads
    uploads = []
    for local, rel, _ in files:
        target = next((_fixed_folder(p) + rel for p in patterns if fnmatch.fnmatchcase(_fixed_folder(p) + rel, p)),
                      None)
        if target is None:
            fixed = [p for p in patterns if not _GLOB.search(p)]
            hint = (f"; --to {fixed[0]} replaces the file it reads with {local.name}" if fixed and len(files) == 1
                    else "")
            raise SourceUploadError(f"pipeline {spec.name!r} reads {shown}: {local.name} would not be among them"
                                    f"{hint}, or declare a source pattern that takes it (e.g. a folder glob)")
        uploads.append(Upload(local, SOURCES_PREFIX + target))
    _refuse_unread_images(spec, uploads, {local: given for local, _, given in files})
    return uploads


def _refuse_unread_images(spec: PipelineSpec, uploads: list[Upload], given: dict[Path, Path]) -> None:
    """An image folder read by class sub-folders reads ``<root>/<class>/<file>`` of a declared
    class and an accepted extension (assets/kinds/image_listing.py); anything else its run
    refuses, so the add refuses it first."""
    src = spec.source
    if not isinstance(src, ImageFolder) or src.manifest is not None:
        return
    folder = SOURCES_PREFIX + src.root.strip("/") + "/"
    classes = list(spec.class_names)
    extensions = sorted({e.lower() for e in src.extensions})
    problems = []
    for upload in uploads:
        parts = upload.target[len(folder):].split("/")
        where = f"{upload.local} would go to {upload.target}"
        if len(parts) == 1:
            origin = given[upload.local]
            hint = (f"; {origin} is named like class {origin.name!r}: add the folder that holds it "
                    f"(`python -m pipelines sources add {spec.name} {origin.parent}`)"
                    if origin.is_dir() and origin.name in classes else
                    f"; add a folder of class folders, or place the file with --to {src.root}/<class>/{upload.local.name}")
            problems.append(f"{where}, directly in the image folder {src.root}/, where pipeline {spec.name!r} reads no "
                            f"image: it reads {src.root}/<class>/<file> of the classes {classes}{hint}")
        elif parts[0] not in classes:
            problems.append(f"{where}, in class folder {parts[0]!r}, which is not one of the declared classes "
                            f"{classes} of pipeline {spec.name!r}")
        elif Path(parts[-1]).suffix.lower() not in extensions:
            problems.append(f"{where}: its extension {Path(parts[-1]).suffix!r} is not among the image extensions "
                            f"{extensions} that pipeline {spec.name!r} reads")
    if problems:
        more = f" (and {len(problems) - 1} more file(s) like it)" if len(problems) > 1 else ""
        raise SourceUploadError(problems[0] + more)


def hidden_local_files(store: VersionedStore, spec: PipelineSpec, uploads: list[Upload],
                       sources_root: Path) -> list[Path]:
    """The local sources folder's files that ``spec`` reads now and would no longer read once
    ``uploads`` are on main: none when the store's area already holds the pipeline's files (it is
    their one place already) or when the uploads replace every one of them."""
    if not store_patterns(spec):
        return []
    place = locate_sources(spec, store, sources_root, store.resolve_ref(MAIN))
    if place.in_store:
        return []
    targets = {u.target[len(SOURCES_PREFIX):] for u in uploads}
    return [f for f in place.folder_files if f.relative_to(sources_root).as_posix() not in targets]


def local_source_folders(spec: PipelineSpec, sources_root: Path) -> list[Path]:
    """What to add to move a pipeline's local sources over to the store: each relative pattern's
    folder (the file itself for a fixed path)."""
    out = []
    for pattern in store_patterns(spec):
        path = sources_root / (pattern if not _GLOB.search(pattern) else _fixed_folder(pattern))
        if path not in out:
            out.append(path)
    return out


def add_source_files(store: VersionedStore, spec: PipelineSpec, uploads: list[Upload],
                     metadata: dict[str, str] | None = None) -> Uploaded:
    """Commit ``uploads`` on a branch from main and merge it into main (write, then publish, as
    every write of the platform); the branch is deleted either way."""
    store.ensure_repository()
    branch = f"sources-{spec.name.replace('_', '-')}-{uuid.uuid4().hex[:12]}"
    store.create_branch(branch, MAIN)
    message = f"Add {len(uploads)} source file(s) to {spec.name}"
    meta = {"dataset": spec.name, "source_files": json.dumps(sorted(u.target for u in uploads)), **(metadata or {})}
    try:
        for upload in uploads:
            store.put_file(branch, upload.target, upload.local)
        if not store.has_uncommitted_changes(branch):  # the same bytes again are no change (as on lakeFS)
            raise SourceUploadError(f"main already holds these {len(uploads)} file(s) with the same content; nothing "
                                    "to commit")
        commit = store.commit(branch, message, meta)
        head = store.merge(branch, MAIN, message, meta)
    finally:
        store.delete_branch(branch)
    return Uploaded(dataset=spec.name, paths=tuple(u.target for u in uploads), commit_id=commit.id,
                    main_commit_id=head)
