"""Artifacts on local disk: ``<root>/<key>``, each written to a temporary file and renamed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from resources.artifacts.base import INCOMING_DIR, ArtifactError, ArtifactStore, validate_key
from resources.store.atomic_files import CHUNK_BYTES, atomic_copy_file
from training_runtime.atomic_files import atomic_output, fsync_path


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
        # Staged under the store's incoming directory, so a key that cannot be created is refused
        # without leaving a temporary beside it; same filesystem, so the rename stays atomic.
        with atomic_output(dest, staging_dir=self.root / INCOMING_DIR) as out:
            with open(local_path, "rb") as src:
                shutil.copyfileobj(src, out, CHUNK_BYTES)
            self._make_room_for(dest, key)
        return self.uri(key)

    @staticmethod
    def _make_room_for(dest: Path, key: str) -> None:
        """Create the directory of ``dest``; raise ArtifactError when the key collides with
        other artifacts (it names a directory of them, or one of its parents is one)."""
        if dest.is_dir():
            raise ArtifactError(f"cannot write artifact {key!r}: a directory of artifacts has that name")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ArtifactError(
                f"cannot write artifact {key!r}: a parent of it is already an artifact; pick another key"
            ) from None

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
        fsync_path(path.parent)  # the deletion reaches the disk with the directory

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()
