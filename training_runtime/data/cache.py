"""Streaming shards: a bounded local cache that fetches s3:// shards on demand, in the order the
rank will read them, with read-ahead, and evicts what this rank has finished with.

A split's shards are ``ShardRef`` s (manifest path, location, sha256, size). ``file://`` shards are
read in place, never copied; each is checked against its sha256 once per process, when first
opened. ``s3://`` shards go through a ``ShardCache``: one per rank process, in its own directory
(``<data.cache_dir>/rank-<local rank>``) with ``data.cache_limit / local_world_size`` bytes of the
node's budget. One directory per rank, not one per node with file locks: the ranks of a node read
different shards (the shard-aware sample order gives each a span of its own), so a shared cache
would mostly add lock traffic, and a rank killed holding a lock cannot stall the others.

What the cache knows of the future is each reader's ``Schedule``: the loader hands it the epoch's
batches (any order), from which it derives, per shard, the batches that read it. Then:

- a gather pins the shards it reads; one that is not on disk is fetched at once (the gather
  waits), and a pinned shard is never evicted;
- a read-ahead thread fetches the shards next needed, in schedule order, while fewer than
  ``read_ahead`` fetched shards wait unread and the budget has room;
- room is made by evicting first shards no schedule reads again, then the one whose next read
  is furthest away (Belady's choice, which knowing the schedule makes possible); read-ahead never
  evicts a shard needed before the one it fetches;
- a fetched shard enters the cache (``<sha256>.bin``) only once its size and sha256 match the
  manifest (hashed as it streams in: no second read); a shard left by an earlier attempt is
  reused after its sha256 is checked again, so a retried run does not fetch it twice.

Fetches retry transient S3 errors (botocore's standard retry mode for each request, and
``FETCH_ATTEMPTS`` attempts around a connection dropped mid-body, each resuming with a Range
request where the last stopped), then fail naming the shard, its URL and the endpoint.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from training_runtime.data.shards import DataError, sha256_file

log = logging.getLogger(__name__)

FETCH_ATTEMPTS = 5  # attempts of one shard's transfer (each resumes where the last stopped)
BACKOFF_S = (0.5, 1.0, 2.0, 4.0)  # sleep before attempt 2, 3, ... (the last value repeats)
CHUNK_BYTES = 1 << 20
IDLE_RECHECK_S = 0.01  # the read-ahead thread, when it found nothing to fetch, looks again after this
DEFAULT_DISK_SHARE = 0.8  # data.cache_limit unset: this share of the cache disk (free + already cached)
PERMANENT_S3_CODES = {"NoSuchKey", "NoSuchBucket", "404", "AccessDenied", "403", "InvalidAccessKeyId",
                      "SignatureDoesNotMatch", "InvalidBucketName"}


class CorruptShardError(DataError):
    """A shard's bytes in the store do not match the manifest's sha256 or size."""


class ShardFetchError(DataError):
    """A shard could not be fetched from the store (after the retries, or a permanent refusal)."""


class CacheFullError(DataError):
    """The shard cache cannot hold what must be on disk at once, or its disk is full."""


# ---------------------------------------------------------------- shard references
@dataclass(frozen=True)
class ShardRef:
    """One shard of a split: its manifest path, location, sha256 and size."""

    name: str
    url: str
    sha256: str
    num_bytes: int

    @property
    def is_local(self) -> bool:
        return self.url.startswith("file://")

    @property
    def local_path(self) -> Path:
        return Path(urllib.parse.unquote(urllib.parse.urlparse(self.url).path))


def shard_refs(manifest: dict, locations: dict[str, str], split: str) -> list[ShardRef]:
    """The split's shards with their locations; checks what can be checked without reading a
    shard (a location for every shard, a supported scheme, file:// shards present)."""
    if split not in manifest["splits"]:
        raise DataError(f"manifest has no split {split!r}; it has {sorted(manifest['splits'])}")
    refs = []
    for shard in manifest["splits"][split]["shards"]:
        url = locations.get(shard["path"])
        if url is None:
            raise DataError(f"data.locations has no entry for shard {shard['path']!r}")
        ref = ShardRef(shard["path"], url, shard["sha256"], int(shard["num_bytes"]))
        if ref.is_local:
            if not ref.local_path.is_file():
                raise DataError(f"shard {ref.name!r} is missing: {ref.local_path} does not exist; "
                                "re-materialize the shards or fix data.locations")
        elif not url.startswith("s3://"):
            raise DataError(f"unsupported location {url!r} for shard {ref.name!r}")
        refs.append(ref)
    return refs


def check_local_shard(ref: ShardRef, path: Path) -> None:
    """Size and sha256 of a shard on local disk against the manifest (DataError naming it)."""
    size = path.stat().st_size
    if size != ref.num_bytes:
        raise CorruptShardError(f"shard {ref.name!r} at {ref.url} has {size} bytes, manifest says "
                                f"{ref.num_bytes} (sha256 {ref.sha256}); the shard does not belong to this manifest")
    digest = sha256_file(path)
    if digest != ref.sha256:
        raise CorruptShardError(f"checksum mismatch for shard {ref.name!r} at {ref.url}: sha256 {digest} != "
                                f"manifest {ref.sha256}; the shard is corrupt or from another commit; "
                                "re-materialize the shards")


# ---------------------------------------------------------------- the readers' schedules
class Schedule:
    """One reader's future reads: for each shard (by sha256), the positions of the batches that
    read it, in the order the reader gathers them. Built from the batches themselves, so any
    sample order works; positions the reader has gathered are marked done (``ShardCache.done``)."""

    def __init__(self, keys: Sequence[str], starts: np.ndarray, batches: Sequence[np.ndarray]):
        self.seq = 0  # set by the cache: schedules registered later read after earlier ones
        nb = len(batches)
        self.done = np.zeros(nb, dtype=bool)
        self.uses: dict[str, np.ndarray] = {}
        self.batch_keys: list[list[str]] = [[] for _ in range(nb)]
        if nb == 0:
            self._ptr: dict[str, int] = {}
            return
        lens = np.array([len(b) for b in batches], dtype=np.int64)
        pos = np.repeat(np.arange(nb, dtype=np.int64), lens)
        idx = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches])
        shard = np.searchsorted(starts, idx, side="right") - 1
        pairs = np.unique(shard * nb + pos)  # (shard, batch) once each, sorted by shard then batch
        shard_u, pos_u = pairs // nb, pairs % nb
        cuts = np.flatnonzero(np.diff(shard_u)) + 1
        for group_s, group_p in zip(np.split(shard_u, cuts), np.split(pos_u, cuts)):
            key = keys[int(group_s[0])]
            prev = self.uses.get(key)  # two shard entries with the same bytes share one file
            self.uses[key] = group_p if prev is None else np.unique(np.concatenate([prev, group_p]))
        for key, positions in self.uses.items():
            for p in positions.tolist():
                self.batch_keys[p].append(key)
        self._ptr = dict.fromkeys(self.uses, 0)

    def next_use(self, key: str) -> int | None:
        """The first position not yet gathered that reads ``key`` (None: none left)."""
        uses = self.uses.get(key)
        if uses is None:
            return None
        p = self._ptr[key]
        while p < len(uses) and self.done[uses[p]]:
            p += 1
        self._ptr[key] = p
        return int(uses[p]) if p < len(uses) else None

    def first_last(self) -> dict[str, tuple[int, int]]:
        """Each shard's first and last read (batch positions)."""
        return {k: (int(u[0]), int(u[-1])) for k, u in self.uses.items()}


# ---------------------------------------------------------------- fetching from S3
class S3Fetcher:
    """Streams one s3:// object into a sink, retrying transient failures; each attempt after the
    first asks only for the bytes still missing (Range), so a connection cut mid-body resumes."""

    def __init__(self, endpoint_url: str | None, attempts: int = FETCH_ATTEMPTS,
                 backoff_s: Sequence[float] = BACKOFF_S):
        self.endpoint_url = endpoint_url
        self.attempts, self.backoff_s = attempts, tuple(backoff_s)
        self._client = None
        self._lock = threading.Lock()

    def client(self):
        with self._lock:
            if self._client is None:
                import boto3  # only needed for s3:// locations
                from botocore.config import Config

                self._client = boto3.client("s3", endpoint_url=self.endpoint_url, config=Config(
                    retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=60))
            return self._client

    def fetch(self, ref: ShardRef, sink: Callable[[bytes], None]) -> int:
        """Write the object's bytes to ``sink`` in order; returns how many attempts it took."""
        from botocore.exceptions import BotoCoreError, ClientError
        from urllib3.exceptions import HTTPError as Urllib3Error

        parsed = urllib.parse.urlparse(ref.url)
        bucket, key = parsed.netloc, parsed.path.lstrip("/")
        written, last = 0, None
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                time.sleep(self.backoff_s[min(attempt - 2, len(self.backoff_s) - 1)] if self.backoff_s else 0)
            try:
                extra = {"Range": f"bytes={written}-"} if written else {}
                body = self.client().get_object(Bucket=bucket, Key=key, **extra)["Body"]
                try:
                    for chunk in body.iter_chunks(CHUNK_BYTES):
                        sink(chunk)
                        written += len(chunk)
                finally:
                    body.close()
                if written >= ref.num_bytes:
                    return attempt
                last = f"the body ended after {written} of {ref.num_bytes} bytes"
            except ClientError as e:
                code = str(e.response.get("Error", {}).get("Code", ""))
                if code in PERMANENT_S3_CODES:
                    raise ShardFetchError(self._message(ref, f"the store refused it ({code}): {e}", attempt)) from e
                last = f"{type(e).__name__}: {e}"
            except (BotoCoreError, Urllib3Error, ConnectionError, TimeoutError) as e:
                last = f"{type(e).__name__}: {e}"
            log.warning("fetching shard %s from %s: attempt %d of %d failed (%s)", ref.name, ref.url, attempt,
                        self.attempts, last)
        raise ShardFetchError(self._message(ref, f"the store is down or unreachable ({last})", self.attempts))

    def _message(self, ref: ShardRef, why: str, attempts: int) -> str:
        return (f"cannot fetch shard {ref.name!r} from {ref.url} (endpoint {self.endpoint_url or 'AWS default'}, "
                f"{attempts} attempt(s)): {why}; check data.s3_endpoint_url, the URL in data.locations and the "
                "AWS_* credentials. A retry of the run resumes from its checkpoint with the shards already cached")


# ---------------------------------------------------------------- the cache
@dataclass
class CacheStats:
    bytes_fetched: int = 0
    fetches: int = 0
    refetches: int = 0  # fetches of a shard this process had fetched before (evicted meanwhile)
    evictions: int = 0
    peak_bytes: int = 0  # on disk at once, shards being fetched included
    reused: int = 0  # shards found on disk from an earlier attempt and reused
    local_verified: int = 0  # file:// shards checked (each once)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Entry:
    ref: ShardRef
    state: str = "absent"  # absent | fetching | ready
    pins: int = 0
    fresh: bool = False  # fetched ahead and not read yet
    verified: bool = False
    error: BaseException | None = None
    failed_at: float = 0.0
    fetched: bool = False


@dataclass
class _Reservation:
    entries: list[_Entry] = field(default_factory=list)


class ShardCache:
    """The shards of every split one rank reads, within ``limit_bytes`` on disk in ``directory``.
    ``acquire``/``release`` bracket every read; readers register their ``Schedule`` (``plan``)."""

    def __init__(self, directory: str | os.PathLike | None, limit_bytes: int, read_ahead: int = 2,
                 endpoint_url: str | None = None, fetcher: S3Fetcher | None = None):
        # None: a split of file:// shards only, which are read in place (nothing is cached)
        self.dir = None if directory is None else Path(directory)
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        if limit_bytes <= 0:
            raise CacheFullError(f"data.cache_limit gives this rank {limit_bytes} bytes in {self.dir}; it must be "
                                 "positive")
        self.limit, self.read_ahead = int(limit_bytes), int(read_ahead)
        self.endpoint_url = endpoint_url
        self.fetcher = fetcher or S3Fetcher(endpoint_url)
        self.stats = CacheStats()
        self._cond = threading.Condition()
        self._entries: dict[str, _Entry] = {}
        self._schedules: list[Schedule] = []
        self._seq = 0
        self._listeners: list[Callable[[str], None]] = []
        self._verified_local: set[tuple[str, str]] = set()
        self._verifying: dict[tuple[str, str], threading.Event] = {}
        self._paths: dict[str, Path] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self._adopt_existing()

    # ------------------------------------------------------------ bookkeeping
    def _adopt_existing(self) -> None:
        """Shards an earlier attempt left: kept (unverified until read) while the budget holds them;
        unfinished downloads are removed."""
        if self.dir is None:
            return
        for p in self.dir.iterdir():
            if p.name.endswith(".part"):
                p.unlink(missing_ok=True)
            elif p.suffix == ".bin" and len(p.stem) == 64:
                ref = ShardRef(p.name, p.as_uri(), p.stem, p.stat().st_size)
                self._entries[p.stem] = _Entry(ref, state="ready")
        self._note_peak()

    def _used(self) -> int:
        return sum(e.ref.num_bytes for e in self._entries.values() if e.state != "absent")

    def _note_peak(self) -> None:
        self.stats.peak_bytes = max(self.stats.peak_bytes, self._used())

    def path_of(self, ref: ShardRef) -> Path:
        path = self._paths.get(ref.url)  # made once per shard: every read asks for it
        if path is None:
            path = self._paths[ref.url] = ref.local_path if ref.is_local else self.dir / f"{ref.sha256}.bin"
        return path

    def add_listener(self, fn: Callable[[str], None]) -> None:
        """``fn(sha256)`` runs (under the cache's lock) before an evicted shard's file is deleted:
        a split drops its memory map, so the disk space is really freed."""
        with self._cond:
            self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[str], None]) -> None:
        with self._cond:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def register(self, refs: Sequence[ShardRef]) -> None:
        """A split's shards; refuses at once a shard larger than this rank's whole budget."""
        cached = [r for r in refs if not r.is_local]
        if cached and self.dir is None:
            raise DataError(f"data.cache_dir is required for s3:// shards (shard {cached[0].name!r} is at "
                            f"{cached[0].url})")
        if cached:
            big = max(cached, key=lambda r: r.num_bytes)
            if big.num_bytes > self.limit:
                raise CacheFullError(
                    f"shard {big.name!r} is {big.num_bytes} bytes, more than this rank's share of data.cache_limit "
                    f"({self.limit} bytes in {self.dir}); raise data.cache_limit (it is split evenly between a "
                    "node's ranks) or cut the data into smaller shards")
            if self.limit < (1 + self.read_ahead) * big.num_bytes:
                log.warning("data.cache_limit gives this rank %d bytes, less than %d shards of %d bytes (one read, "
                            "data.read_ahead=%d ahead): read-ahead is limited to what fits", self.limit,
                            1 + self.read_ahead, big.num_bytes, self.read_ahead)
        with self._cond:
            for r in cached:
                e = self._entries.get(r.sha256)
                if e is None:
                    self._entries[r.sha256] = _Entry(r)
                elif e.ref.url != r.url and e.ref.url.startswith("file://") and e.ref.name.endswith(".bin"):
                    e.ref = ShardRef(r.name, r.url, r.sha256, r.num_bytes)  # an adopted file: now named

    # ------------------------------------------------------------ schedules
    def plan(self, schedule: Schedule) -> Schedule:
        with self._cond:
            self._seq += 1
            schedule.seq = self._seq
            self._schedules.append(schedule)
            self._start_read_ahead()
            self._cond.notify_all()
        return schedule

    def unplan(self, schedule: Schedule) -> None:
        with self._cond:
            if schedule in self._schedules:
                self._schedules.remove(schedule)
            self._cond.notify_all()

    def done(self, schedule: Schedule, positions: Sequence[int]) -> None:
        """The reader has gathered these batch positions."""
        with self._cond:
            schedule.done[list(positions)] = True
            self._cond.notify_all()

    def _next_use(self, key: str) -> tuple[int, int] | None:
        for s in self._schedules:  # in registration order: an earlier schedule reads first
            p = s.next_use(key)
            if p is not None:
                return s.seq, p
        return None

    # ------------------------------------------------------------ reading
    def acquire(self, refs: Sequence[ShardRef]) -> list[Path]:
        """Local paths of ``refs``, each on disk, verified and pinned until ``release``; fetches
        what is missing (waiting for the read-ahead's fetch of a shard already under way)."""
        unique = list({r.sha256: r for r in refs}.values())
        local = [r for r in unique if r.is_local]
        cached = [r for r in unique if not r.is_local]
        for r in local:
            self._verify_local_once(r)
        if cached:
            mine = self._reserve_and_pin(cached)
            try:
                for e in mine:
                    self._fetch(e)
                self._await_ready(cached)
            except BaseException:
                with self._cond:
                    for e in mine:
                        if e.state == "fetching":
                            e.state = "absent"
                self.release(cached)
                raise
        return [self.path_of(r) for r in refs]

    def release(self, refs: Sequence[ShardRef]) -> None:
        with self._cond:
            for sha in {r.sha256 for r in refs if not r.is_local}:
                e = self._entries[sha]
                e.pins = max(0, e.pins - 1)
            self._cond.notify_all()

    def _verify_local_once(self, ref: ShardRef) -> None:
        key = (str(ref.local_path), ref.sha256)
        with self._cond:
            if key in self._verified_local:
                return
            event = self._verifying.get(key)
            owner = event is None
            if owner:
                event = self._verifying[key] = threading.Event()
        if not owner:  # another thread checks this file: read it once, not twice
            event.wait()
            with self._cond:
                if key in self._verified_local:
                    return
            self._verify_local_once(ref)  # that check failed: this thread checks and raises itself
            return
        try:
            check_local_shard(ref, ref.local_path)
            with self._cond:
                self._verified_local.add(key)
                self.stats.local_verified += 1
        finally:
            with self._cond:
                self._verifying.pop(key, None)
            event.set()

    def _reserve_and_pin(self, refs: list[ShardRef]) -> list[_Entry]:
        """Pin every ref; the absent ones are reserved (room made by eviction) for this thread to
        fetch. Waits while other readers' pins hold the room needed; refuses what can never fit."""
        total = sum(r.num_bytes for r in refs)
        if total > self.limit:
            names = ", ".join(r.name for r in refs[:8]) + (" ..." if len(refs) > 8 else "")
            raise CacheFullError(
                f"one load reads {len(refs)} shards ({names}) of {total} bytes together, more than this rank's share "
                f"of data.cache_limit ({self.limit} bytes in {self.dir}); raise data.cache_limit (a rank needs room for "
                "the shards one batch reads, about data.shuffle_block of them, plus data.read_ahead more), or lower "
                "data.shuffle_block")
        with self._cond:
            if any(r.sha256 not in self._entries for r in refs):
                self.register(refs)
            while True:
                entries = [self._entries[r.sha256] for r in refs]
                missing = [e for e in entries if e.state == "absent"]
                need = sum(e.ref.num_bytes for e in missing)
                victims = self._victims(need, protect={e.ref.sha256 for e in entries})
                if victims is not None:
                    for v in victims:
                        self._evict(v)
                    for e in missing:
                        e.state, e.error = "fetching", None
                    for e in entries:
                        e.pins += 1
                        e.fresh = False
                    if missing:  # only a reservation adds to what the cache holds
                        self._note_peak()
                    return missing
                if self._closed:
                    raise DataError("the shard cache was closed")
                self._cond.wait(0.5)  # other readers' pinned shards hold the room: they release it

    def _victims(self, need: int, protect: set[str], before: tuple[int, int] | None = None) -> list[_Entry] | None:
        """Ready, unpinned shards to evict so that ``need`` more bytes fit (None: they cannot now).
        First shards nothing reads again, then the furthest next read (Belady). ``before``: only
        shards read after that point may go (read-ahead must not evict what is needed sooner)."""
        if need <= 0:  # every shard asked for is here or coming: nothing to make room for
            return []
        free = self.limit - self._used()
        if need <= free:
            return []
        ranked = []
        for e in self._entries.values():
            if e.state != "ready" or e.pins or e.ref.sha256 in protect:
                continue
            nxt = self._next_use(e.ref.sha256)
            if nxt is not None and before is not None and nxt <= before:
                continue
            ranked.append(((0, 0, 0) if nxt is None else (1, -nxt[0], -nxt[1]), e))
        ranked.sort(key=lambda t: t[0])
        chosen = []
        for _, e in ranked:
            if need <= free:
                break
            chosen.append(e)
            free += e.ref.num_bytes
        return chosen if need <= free else None

    def _evict(self, e: _Entry) -> None:
        for fn in list(self._listeners):
            fn(e.ref.sha256)  # the split drops its map before the file goes
        (self.dir / f"{e.ref.sha256}.bin").unlink(missing_ok=True)
        e.state, e.fresh, e.verified = "absent", False, False
        self.stats.evictions += 1

    def _await_ready(self, refs: list[ShardRef]) -> None:
        """Wait for fetches by the read-ahead; a failed one is fetched again here (and raises)."""
        for r in refs:
            e = self._entries[r.sha256]
            with self._cond:
                while e.state == "fetching":
                    self._cond.wait(0.5)
                retry = e.state == "absent"  # the read-ahead's fetch failed
                if retry:
                    victims = self._victims(e.ref.num_bytes, protect={x.sha256 for x in refs})
                    if victims is None:
                        raise CacheFullError(f"no room for shard {r.name!r} in this rank's share of data.cache_limit "
                                             f"({self.limit} bytes in {self.dir})")
                    for v in victims:
                        self._evict(v)
                    e.state = "fetching"
                    self._note_peak()
            if retry:
                self._fetch(e)
            elif not e.verified:
                self._verify_reused(e)

    def _verify_reused(self, e: _Entry) -> None:
        """A shard found on disk from an earlier attempt: its sha256 is checked before it is read;
        a damaged copy is fetched again (the store's copy may be fine)."""
        path = self.dir / f"{e.ref.sha256}.bin"
        try:
            check_local_shard(e.ref, path)
        except (DataError, OSError):
            log.warning("cached shard %s (%s) is damaged; fetching it again", e.ref.name, path)
            path.unlink(missing_ok=True)
            with self._cond:
                e.state = "fetching"
            self._fetch(e)
            return
        with self._cond:
            e.verified = True
            self.stats.reused += 1

    def _fetch(self, e: _Entry) -> None:
        """Fetch a reserved shard (state 'fetching', counted in the budget) into the cache."""
        ref = e.ref
        final = self.dir / f"{ref.sha256}.bin"
        tmp = self.dir / f".{ref.sha256}.{uuid.uuid4().hex[:8]}.part"
        digest, size = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as f:
                def sink(chunk: bytes) -> None:
                    nonlocal size
                    try:
                        f.write(chunk)
                    except OSError as err:
                        if err.errno == errno.ENOSPC:
                            raise self._disk_full(ref, err) from err
                        raise
                    digest.update(chunk)
                    size += len(chunk)

                if ref.is_local or ref.url.startswith("file://"):
                    raise DataError(f"shard {ref.name!r} at {ref.url} is not an s3:// location")
                self.fetcher.fetch(ref, sink)
                try:
                    f.flush()
                except OSError as err:
                    if err.errno == errno.ENOSPC:
                        raise self._disk_full(ref, err) from err
                    raise
            if size != ref.num_bytes:
                raise CorruptShardError(
                    f"shard {ref.name!r} (sha256 {ref.sha256}) at {ref.url} has {size} bytes in the store, the manifest "
                    f"says {ref.num_bytes}: it is corrupt in the store or from another commit; re-materialize the shards")
            got = digest.hexdigest()
            if got != ref.sha256:
                raise CorruptShardError(
                    f"checksum mismatch for shard {ref.name!r} at {ref.url}: sha256 {got} != manifest {ref.sha256}; the "
                    "shard is corrupt in the store or from another commit; re-materialize the shards")
            os.replace(tmp, final)
        except BaseException as err:
            tmp.unlink(missing_ok=True)
            with self._cond:
                e.state, e.error, e.failed_at = "absent", err, time.monotonic()
                self._cond.notify_all()
            raise
        with self._cond:
            e.state, e.verified = "ready", True
            self.stats.fetches += 1
            self.stats.refetches += e.fetched
            e.fetched = True
            self.stats.bytes_fetched += size
            self._cond.notify_all()

    def _disk_full(self, ref: ShardRef, err: OSError) -> CacheFullError:
        free = shutil.disk_usage(self.dir).free
        return CacheFullError(
            f"the shard cache's disk is full writing shard {ref.name!r} into {self.dir} ({free} bytes free): "
            f"data.cache_limit ({self.limit} bytes for this rank) is more than the disk holds; lower "
            "data.cache_limit or point data.cache_dir at a larger disk")

    # ------------------------------------------------------------ read-ahead
    def _start_read_ahead(self) -> None:
        if self.read_ahead > 0 and self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._read_ahead_loop, daemon=True, name="shard-read-ahead")
            self._thread.start()

    def _read_ahead_loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                e = self._next_to_prefetch()
                if e is None:
                    self._cond.wait(0.5)
            if e is None:
                # Readers wake this thread at every batch; with nothing to fetch (a warm cache, or
                # enough read ahead) each look scans every shard under the lock the readers take.
                # Looking again at most every IDLE_RECHECK_S keeps that off their time; a fetch
                # starts that much later at worst, far less than the fetch itself takes.
                time.sleep(IDLE_RECHECK_S)
                continue
            try:
                self._fetch(e)
                with self._cond:
                    e.fresh = e.pins == 0
            except BaseException as err:  # the reader that needs it fetches it itself, and raises
                log.warning("read-ahead of shard %s failed: %s", e.ref.name, err)

    def _next_to_prefetch(self) -> _Entry | None:
        """Reserve the next shard to read ahead, or None (enough ahead, no room, nothing to read)."""
        ahead = sum(1 for e in self._entries.values() if e.fresh and e.pins == 0 and e.state != "absent")
        if ahead >= self.read_ahead:
            return None
        now, best = time.monotonic(), None
        for e in self._entries.values():
            if e.state != "absent" or e.ref.is_local or now - e.failed_at < 5.0:
                continue
            nxt = self._next_use(e.ref.sha256)
            if nxt is not None and (best is None or nxt < best[0]):
                best = (nxt, e)
        if best is None:
            return None
        nxt, e = best
        victims = self._victims(e.ref.num_bytes, protect={e.ref.sha256}, before=nxt)
        if victims is None:
            return None
        for v in victims:
            self._evict(v)
        e.state, e.fresh = "fetching", True
        self._note_peak()
        return e

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)


def default_cache_limit(directory: str | os.PathLike) -> int:
    """``data.cache_limit`` unset: DEFAULT_DISK_SHARE of what the cache's disk can give it (its
    free space plus the shards already cached there), leaving room for checkpoints and logs."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cached = sum(p.stat().st_size for p in d.rglob("*.bin") if p.is_file())
    return int(DEFAULT_DISK_SHARE * (shutil.disk_usage(d).free + cached))
