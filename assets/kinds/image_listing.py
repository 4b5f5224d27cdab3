"""Which images an image folder holds and the label of each: from class sub-folders, or from a
manifest. Only paths and names are read here; the images themselves are checked on the pool.

A local folder is listed by its files (links and all); the store's ``sources/`` area by its
listing (``StoreListing``): names and sizes, with nothing downloaded but a manifest."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pandas as pd

from assets.quality.tables import label_text
from core.spec import ImageFolder, PipelineSpec

MAX_MESSAGES = 200  # a systematic problem in a million files is reported by its first examples and a count


class Problems:
    """What is wrong with the source, one message per file and problem, the file named by its
    path under the sources root (``<root>/<id>``)."""

    def __init__(self, folder: str, limit: int = MAX_MESSAGES):
        self.folder, self.limit = folder.rstrip("/"), limit
        self._messages: list[str] = []
        self.count = 0

    def file(self, image_id: str, problem: str) -> None:
        self.add(f"{self.folder}/{image_id}: {problem}")

    def add(self, message: str) -> None:
        self.count += 1
        if len(self._messages) < self.limit:
            self._messages.append(message)

    def extend(self, messages: list[str], count: int) -> None:
        """Take another checker's findings (an ingest step's: ``messages``, its first ones in the
        order found, of ``count`` in all) after this one's, as if found here."""
        for message in messages:
            self.add(message)
        self.count += count - len(messages)

    def found(self) -> tuple[list[str], int]:
        """(the messages kept, in the order found; how many problems in all): what ``extend`` takes."""
        return list(self._messages), self.count

    def messages(self) -> list[str]:
        more = self.count - len(self._messages)
        return self._messages + ([f"... and {more} more problem(s) of the same kinds"] if more else [])


@dataclass(frozen=True)
class Entry:
    """One image to ingest."""

    id: str  # path relative to the image folder (POSIX): the sample's id
    path: Path  # where to read it (a link inside the sources root is read through)
    label: str | None
    label_ok: bool  # the label is a declared class
    source_key: str  # path relative to the sources root: its key in the sources description

    @property
    def extension(self) -> str:
        return PurePosixPath(self.id).suffix.lower()


def normalised_relative(path: str) -> str | None:
    """``path`` as a clean relative POSIX path, or None when it is absolute or climbs out with '..'."""
    p = PurePosixPath(path.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or not p.parts:
        return None
    return p.as_posix()


@dataclass(frozen=True)
class StoreListing:
    """An image folder's files as the store lists them, none downloaded: ``files``, each file's
    name under the sources root (where it is downloaded to) and size. A store holds no links and
    no empty folders. ``fetch(name)`` downloads one file under the root and gives its path: only
    the manifest is read here."""

    files: tuple[tuple[str, int], ...]
    fetch: Callable[[str], Path]


def list_entries(spec: PipelineSpec, files: Sequence[Path] | StoreListing, root: Path, problems: Problems,
                 sources: dict[str, dict]) -> list[Entry]:
    """The images among ``files`` (all under ``root``; local files, or the store's listing) with
    their labels. Refused files are reported to ``problems``; every file gets a description in
    ``sources``. An entry of the store's listing is to be read at its path under ``root``, once
    downloaded there."""
    src: ImageFolder = spec.source
    folder = root / src.root
    manifest_id = normalised_relative(src.manifest) if src.manifest else None
    extensions = {e.lower() for e in src.extensions}
    candidates: dict[str, tuple[Path, str]] = {}
    refused: set[str] = set()
    manifest: Path | None = None
    root_prefix, folder_prefix = str(root).rstrip(os.sep) + os.sep, str(folder).rstrip(os.sep) + os.sep
    in_store = isinstance(files, StoreListing)
    for f, size, link, problem_of in (_store_files(files, root) if in_store else _local_files(files, root)):
        key = _under(f, root_prefix) or Path(os.path.relpath(f, root)).as_posix()
        sources[key] = {"file": key, "bytes": size, **({"link": True} if link else {})}
        image_id = _under(f, folder_prefix)
        if image_id is None:
            problems.add(f"{key}: lies outside the image folder {src.root}/")
            continue
        problem = problem_of()
        if problem is None and image_id != manifest_id and PurePosixPath(image_id).suffix.lower() not in extensions:
            problem = f"has an extension not in the accepted extensions {sorted(extensions)}"
        if problem is not None:
            problems.file(image_id, problem)
            refused.add(image_id)
        elif image_id == manifest_id:
            manifest = files.fetch(key) if in_store else f
        else:
            candidates[image_id] = (f, key)
    if src.manifest:
        return _manifest_entries(spec, manifest, candidates, refused, problems)
    # a store lists no empty folder: every folder it has holds a file
    folders = [] if in_store else _folders(folder)
    return _class_folder_entries(spec, folders, candidates, refused, problems)


Listed = tuple[Path, int, bool, Callable[[], "str | None"]]  # path, bytes, a link, its problem if any


def _local_files(files: Sequence[Path], root: Path) -> Iterator[Listed]:
    """Each local file's own size and whether it is a link (not followed), and its link problem,
    found only for the files in the image folder (``_link_problem``)."""
    root_real = root.resolve()
    real_dirs: dict[Path, Path] = {}  # a folder's resolved path, found once for all its files
    for f in files:
        st = f.lstat()
        link = stat.S_ISLNK(st.st_mode)
        yield f, st.st_size, link, lambda f=f, link=link, st=st: _link_problem(f, root_real, link, st, real_dirs)


def _store_files(listing: StoreListing, root: Path) -> Iterator[Listed]:
    """Each of the store's files where it would be downloaded; never a link, so never a link problem."""
    for name, size in listing.files:
        yield root / name, size, False, lambda: None


def _folders(folder: Path) -> list[str]:
    """The sub-folders of a local image folder (links to folders are not class folders)."""
    return sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.is_symlink()) if folder.is_dir() else []


def _under(f: Path, prefix: str) -> str | None:
    """``f``'s path below ``prefix`` (a folder's path and a separator) as POSIX, or None when it is
    not below it: ``relative_to`` by its string, which costs a fraction of pathlib's per file."""
    text = str(f)
    if not text.startswith(prefix) or len(text) == len(prefix):
        return None
    rest = text[len(prefix):]
    return rest if os.sep == "/" else rest.replace(os.sep, "/")


def _link_problem(f: Path, root_real: Path, link: bool, st: os.stat_result, real_dirs: dict[Path, Path]) -> str | None:
    """A file, or a link to one, inside the sources root; anything else is refused. ``st`` is the
    file's own lstat. A file that is not a link resolves to its folder's resolved path and its name,
    so only links and each folder once are resolved (a resolve per file, a stat per part of its
    path, was most of the time an edit of a large folder took: benchmarks, row 8f)."""
    if link:
        target = f.resolve()
    else:
        parent = real_dirs.get(f.parent)
        if parent is None:
            parent = real_dirs[f.parent] = f.parent.resolve()
        target = parent / f.name
    if not target.is_relative_to(root_real):
        return f"is a link to {target}, outside the sources root; copy the file in instead"
    if link and not target.exists():
        return f"is a broken link (to {target})"
    if stat.S_ISDIR(st.st_mode) or (link and target.is_dir()):
        return "is a link to a folder, not to an image file"
    return None


def _class_folder_entries(spec: PipelineSpec, on_disk: list[str], candidates: dict[str, tuple[Path, str]],
                          refused: set[str], problems: Problems) -> list[Entry]:
    """``root/<class>/<file>``: the first folder under root names the class (``on_disk``: the
    image folder's sub-folders, so that an empty one is reported)."""
    classes = set(spec.class_names)
    entries, undeclared = [], {}
    for image_id, (path, key) in candidates.items():
        parts = image_id.split("/")
        if len(parts) == 1:
            problems.file(image_id, "lies directly in the image folder; put it in its class's sub-folder "
                                    "(<root>/<class>/<file>) or list it in a manifest")
            continue
        label = parts[0]
        if label not in classes:
            undeclared[label] = undeclared.get(label, 0) + 1
        entries.append(Entry(image_id, path, label, label in classes, key))
    for label, n in sorted(undeclared.items()):
        problems.add(f"{problems.folder}/{label}/: class folder {label!r} ({n} image(s)) is not one of the declared "
                     f"classes {list(spec.class_names)}")
    with_files = {i.split("/")[0] for i in [*candidates, *refused] if "/" in i}
    for name in on_disk:
        if name not in with_files:
            problems.add(f"{problems.folder}/{name}/: class folder is empty")
    for label in spec.class_names:
        if label not in with_files and label not in on_disk:
            problems.add(f"{problems.folder}/{label}/: class {label!r} has no images (no such folder)")
    return entries


def _manifest_entries(spec: PipelineSpec, manifest: Path | None, candidates: dict[str, tuple[Path, str]],
                      refused: set[str], problems: Problems) -> list[Entry]:
    """Images and labels as the manifest lists them; every image in the folder must be listed."""
    src: ImageFolder = spec.source
    name = f"{problems.folder}/{src.manifest}"
    if manifest is None:
        problems.add(f"{name}: the manifest is not in the image folder")
        return []
    frame = _read_manifest(manifest, name, problems)
    if frame is None:
        return []
    missing = [c for c in (src.path_column, src.label_column) if c not in frame.columns]
    if missing:
        problems.add(f"{name}: lacks column(s) {missing} (it has {list(frame.columns)})")
        return []
    classes = set(spec.class_names)
    entries, seen = [], {}
    for row, (raw_path, raw_label) in enumerate(zip(frame[src.path_column], frame[src.label_column]), start=1):
        where = f"{name} row {row}"
        image_id = normalised_relative(str(raw_path)) if not _blank(raw_path) else None
        if image_id is None:
            problems.add(f"{where}: path {raw_path!r} is empty, absolute or leaves the image folder ('..')")
            continue
        if image_id in seen:
            problems.add(f"{where}: {image_id} is listed twice (first on row {seen[image_id]})")
            continue
        seen[image_id] = row
        if image_id in refused:
            continue  # already reported with its problem
        if image_id not in candidates:
            problems.add(f"{where}: {problems.folder}/{image_id} does not exist")
            continue
        label = None if _blank(raw_label) else label_text(raw_label)
        if label is None:
            problems.file(image_id, f"has no label (manifest row {row})")
        elif label not in classes:
            problems.file(image_id, f"has the label {label!r} (manifest row {row}), not one of the declared classes "
                                    f"{list(spec.class_names)}")
        path, key = candidates[image_id]
        entries.append(Entry(image_id, path, label, label in classes, key))
    for image_id in sorted(set(candidates) - set(seen)):
        problems.file(image_id, f"is not listed in the manifest {src.manifest}")
    return entries


def _read_manifest(path: Path, name: str, problems: Problems) -> pd.DataFrame | None:
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(path, dtype=str, keep_default_na=False)
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path)
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        problems.add(f"{name}: cannot be read: {type(exc).__name__}: {exc}")
        return None
    problems.add(f"{name}: a manifest is a .csv or .parquet file")
    return None


def _blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or (
        not isinstance(value, str) and bool(pd.isna(value)))
