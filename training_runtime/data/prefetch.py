"""Background loading: threads that load whole batches ahead of the training step, in a deterministic
order, hand them to the consumer, and start the next epoch's loader before this one ends."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from training_runtime.data.sampling import sorted_batches
from training_runtime.data.shards import DataError


class _Stop(Exception):
    pass


class BatchPrefetcher:
    """Iterates one epoch of batches for this rank from ``start_step``. Batches are loaded
    ``batches_per_load`` at a time (consecutive ones): ``num_workers`` threads each load every
    num_workers-th load into its own bounded queue; the consumer reads the queues round-robin, so
    order is deterministic. ``load_batches(list of sorted index arrays)`` runs in those threads and
    returns the batches made on the host; ``deliver(item)`` runs on the consumer (it moves a batch
    to the device). ``wait_s`` accumulates the time the consumer waited.

    Loading several batches at once amortises the fixed cost of a load (planning, allocation, a
    queue hand-off between threads) when batches are small.

    ``then`` (set by ``chained_epochs``) is the next epoch's loader: it is started once this
    loader's remaining batches are all in flight, so the next epoch's first batches are ready when
    this epoch ends instead of being gathered while training waits."""

    def __init__(self, load_batches: Callable[[list[np.ndarray]], list], deliver: Callable[[object], object],
                 indices: np.ndarray, batch_size: int, start_step: int, num_workers: int = 1,
                 prefetch_batches: int = 4, batches_per_load: int = 1):
        self.load_batches, self.deliver = load_batches, deliver
        self.batches = sorted_batches(indices, batch_size)
        self.start = start_step
        self.num_workers = num_workers
        self.per_load = max(1, batches_per_load)
        depth = max(1, math.ceil(prefetch_batches / (num_workers * self.per_load)))
        self.queues: list[queue.Queue] = [queue.Queue(maxsize=depth) for _ in range(num_workers)]
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.wait_s = 0.0
        self.lookahead = depth * num_workers * self.per_load
        self.then: BatchPrefetcher | None = None

    def __len__(self) -> int:
        return len(self.batches) - self.start

    def _produce(self, w: int) -> None:
        q, step = self.queues[w], self.num_workers * self.per_load
        try:
            for b in range(self.start + w * self.per_load, len(self.batches), step):
                self._put(q, self.load_batches(self.batches[b:b + self.per_load]))
        except _Stop:
            return
        except BaseException as e:  # handed to the consumer, which re-raises it
            try:
                self._put(q, e)
            except _Stop:
                pass

    def _put(self, q: queue.Queue, item: object) -> None:
        while True:
            if self.stop.is_set():
                raise _Stop
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def start_gathering(self) -> None:
        """Start the loader threads (idempotent; iterating starts them too)."""
        if self.threads or self.stop.is_set():
            return
        self.threads = [threading.Thread(target=self._produce, args=(w,), daemon=True,
                                         name=f"shard-loader-{w}") for w in range(self.num_workers)]
        for t in self.threads:
            t.start()

    def __iter__(self) -> Iterator:
        self.start_gathering()
        start_next_at = max(self.start, len(self.batches) - self.lookahead)
        loaded: list = []
        try:
            for b in range(self.start, len(self.batches)):
                if b == start_next_at and self.then is not None:
                    self.then.start_gathering()
                t0 = time.perf_counter()
                pos = b - self.start
                if pos % self.per_load == 0:  # the next load, from the worker whose turn it is
                    loaded = self.queues[pos // self.per_load % self.num_workers].get()
                    if isinstance(loaded, BaseException):
                        last = min(b + self.per_load, len(self.batches)) - 1
                        which = f"batch {b}" if last == b else f"batches {b}-{last}"
                        raise DataError(f"loading {which} failed: {loaded}") from loaded
                batch = self.deliver(loaded[pos % self.per_load])
                self.wait_s += time.perf_counter() - t0
                yield batch
        finally:
            self.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)


def chained_epochs(make_loader: Callable[[int, int], BatchPrefetcher], start_step: int, steps_per_epoch: int,
                   total_steps: int) -> Iterator[tuple[int, BatchPrefetcher]]:
    """``(epoch, loader)`` from ``start_step``'s epoch on, ``make_loader(epoch, first_step_in_epoch)``
    building each; every loader starts the next one's gathering before its own epoch ends.
    Loaders are closed when their epoch is done or the caller stops iterating; nothing is
    yielded when ``start_step`` is already ``total_steps`` (a finished run resumed)."""
    if start_step >= total_steps:
        return
    epoch, in_epoch = divmod(start_step, steps_per_epoch)
    loader, upcoming = make_loader(epoch, in_epoch), None
    try:
        while True:
            upcoming = make_loader(epoch + 1, 0) if (epoch + 1) * steps_per_epoch < total_steps else None
            loader.then = upcoming
            yield epoch, loader
            loader.close()
            if upcoming is None:
                return
            epoch, loader, upcoming = epoch + 1, upcoming, None
    finally:
        loader.close()
        if upcoming is not None:
            upcoming.close()
