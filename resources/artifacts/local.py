"""Artifacts on local disk: ``<root>/<key>``, each written to a temporary file and renamed."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from resources.artifacts.base import INCOMING_DIR, ArtifactError, ArtifactStore, validate_key
from resources.store.atomic_files import CHUNK_BYTES, atomic_copy_file, fsync_dir


class LocalArtifactStore(ArtifactStore):
    def __init__(self, root: Path):
        self.root = Path(root).absolute()

    def __repr__(self) -> str:
        return f"LocalArtifactStore(root={str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def put_file(self, local_path: Path, key: str) -> str:
        dest = self._path(key)
        local_path = Path(local_path)
        if not local_path.is_file():
            raise ArtifactError(f"cannot upload {local_path}: it is not a readable file")
        incoming = self.root / INCOMING_DIR
        incoming.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=incoming, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out, open(local_path, "rb") as src:
                while chunk := src.read(CHUNK_BYTES):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if dest.is_dir():
                raise ArtifactError(f"cannot write artifact {key!r}: a directory of artifacts has that name")
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise ArtifactError(
                    f"cannot write artifact {key!r}: a parent of it is already an artifact; pick another key"
                ) from None
            # Same filesystem, so the rename is atomic: readers see the old or the whole new file.
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(dest.parent)
        return self.uri(key)

    def get_file(self, key: str, dest: Path) -> Path:
        src = self._path(key)
        if not src.is_file():
            raise ArtifactError(f"artifact {key!r} not found under {self.root}")
        return atomic_copy_file(src, Path(dest))

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list_keys(self, prefix: str = "") -> list[str]:
        if not self.root.exists():
            return []
        keys = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            if Path(dirpath) == self.root and INCOMING_DIR in dirnames:
                dirnames.remove(INCOMING_DIR)
            for name in filenames:
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        if not path.is_file():
            raise ArtifactError(f"cannot delete artifact {key!r}: not found under {self.root}")
        path.unlink()
        fsync_dir(path.parent)

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()
