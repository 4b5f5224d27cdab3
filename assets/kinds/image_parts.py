"""An image folder in parts: the unit that ingest and sharding reuse when the folder changes.

A 2 TB folder that gains 5 files should cost 5 files, not 2 TB. So the raw copy and the shards
of an image folder are kept per *part*, a set of images in id order, and each part is named by a
key of what it holds. A new version keeps every part of the previous version whose images are
all still there, unchanged (their raw copy and shards stay where they lie in the store, and are
neither read nor written); the images no kept part holds (new ones, changed ones, and the
others of a part that lost one) make new parts. That is an append to a Delta or Iceberg table:
new files beside the old ones, and a file with a deleted row rewritten. Added images therefore
cost only themselves wherever their names fall, and a removed or changed image costs its part.

Where a part ends among the images it is cut from is decided by their ids alone
(content-defined chunking over the sorted ids, as restic and FastCDC cut files): a part ends
after an id whose hash falls in one ``target``-th of the hash range, once the part holds
``target // 4`` images, or at ``4 * target`` images. So a folder ingested from nothing gives the
same parts whatever order its files were listed in, and cutting at fixed counts, which would
move every later cut by one image per edit, is avoided.

A part's key is the sha256 of the run's ``salt`` (the data key's parameters and code: anything
that changes how an image is checked or preprocessed makes every part new) and each member's
id, label and file sha256. Its name, in file names, hashes the members alone, so the same images
make the same file names whatever else changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

PARTS_FORMAT = "model-factory.image-parts/v1"
INDEX_NAME = "parts.json"  # the raw copy's index, datasets/<name>/raw/parts.json
RAW_DIR = "images"  # raw/images/<key>.parquet: one part's rows with the original bytes
ROWS_DIR = "image-rows"  # raw/image-rows/<key>.parquet: the same rows without the bytes (for the suite)
KEY_CHARS = 16  # of the key's hex digest in file names: 64 bits, collision-free at any folder size


@dataclass(frozen=True)
class Part:
    key: str  # sha256 hex of the salt and the members: what decides reuse
    name: str  # of the members alone (KEY_CHARS hex): the same images get the same file names
    start: int  # index of its first entry among the sorted entries
    stop: int  # one past its last


def _hash64(image_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(image_id.encode(), digest_size=8).digest(), "little")


def cut_points(ids: Sequence[str], target: int) -> list[int]:
    """Stops of the parts of ``ids`` (sorted): each part is ``ids[previous stop:stop]``."""
    if target < 1:
        raise ValueError(f"a part's target size must be at least 1 image, got {target}")
    least, most = max(1, target // 4), 4 * target
    stops, start = [], 0
    for i, image_id in enumerate(ids):
        size = i + 1 - start
        if size >= most or (size >= least and _hash64(image_id) % target == 0):
            stops.append(i + 1)
            start = i + 1
    if start < len(ids):
        stops.append(len(ids))
    return stops


def part_key(salt: str, members: Sequence[tuple[str, str | None, str]]) -> str:
    """sha256 of ``salt`` and the members' (id, label, file sha256), in id order."""
    h = hashlib.sha256(salt.encode())
    for member in members:
        h.update(b"\0" + json.dumps(list(member), separators=(",", ":")).encode())
    return h.hexdigest()


def split_into_parts(members: Sequence[tuple[str, str | None, str]], target: int, salt: str) -> list[Part]:
    """``members`` are (id, label, sha256) sorted by id; the parts that hold them, in order."""
    parts, start = [], 0
    for stop in cut_points([m[0] for m in members], target):
        held = members[start:stop]
        parts.append(Part(part_key(salt, held), part_key("", held)[:KEY_CHARS], start, stop))
        start = stop
    return parts


def plan_parts(members: Sequence[tuple[str, str | None, str]], target: int, salt: str,
               previous: Sequence[tuple[str, Sequence[tuple[str, str | None, str]]]] = ()
               ) -> tuple[list[str], list[int], list[Part]]:
    """``members`` (id, label, sha256) sorted by id; ``previous`` the previous version's parts as
    (key, members). Returns (the keys of the previous parts kept, the positions in ``members`` of
    the images no kept part holds, the new parts cut from those: their start and stop index that
    list of positions)."""
    current = {m[0]: m for m in members}
    kept, claimed = [], set()
    for key, held in previous:
        if intact(key, held, current, salt):
            kept.append(key)
            claimed.update(m[0] for m in held)
    rest = [i for i, m in enumerate(members) if m[0] not in claimed]
    return kept, rest, split_into_parts([members[i] for i in rest], target, salt)


def intact(key: str, held: Sequence[tuple[str, str | None, str]], current: dict[str, tuple], salt: str) -> bool:
    """A previous part is kept when every image it holds is still there with the same label and
    bytes, and its key is what this run's salt gives those members (same parameters and code)."""
    held = [tuple(m) for m in held]
    return bool(held) and all(current.get(m[0]) == m for m in held) and part_key(salt, held) == key


def raw_part_path(name: str) -> str:
    return f"{RAW_DIR}/{name}.parquet"


def rows_part_path(name: str) -> str:
    return f"{ROWS_DIR}/{name}.parquet"


def index(parts: list[dict], salt: str, target: int) -> dict:
    """The raw copy's index: every part of the version, in id order, with what the shards step and
    the next version need without opening it."""
    return {"format": PARTS_FORMAT, "salt": salt, "target_images": target, "parts": parts,
            "rows": sum(p["rows"] for p in parts)}


def read_index(data: bytes) -> dict:
    found = json.loads(data)
    if found.get("format") != PARTS_FORMAT:
        raise ValueError(f"the raw copy's index has format {found.get('format')!r}, not {PARTS_FORMAT!r}; "
                         "re-materialise the raw dataset")
    return found


def shard_part(path: str) -> str:
    """The part name a shard file belongs to: ``<split>/<part name>-<n>.bin``."""
    return path.rsplit("/", 1)[-1].split("-", 1)[0]
