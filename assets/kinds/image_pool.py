"""The process pool that checks and preprocesses images on every core.

Workers come from the ``forkserver`` start method: a fork of a clean server process, so a pool
started inside a threaded host (Dagster's executor, gRPC, Great Expectations) cannot inherit a
lock some other thread held at fork time and hang. The server imports this module once
(preloaded), so each new worker starts in milliseconds. A worker also re-runs the main script
when the program was started as ``python script.py`` (multiprocessing's rule for ``spawn`` and
``forkserver``); the modules that script imports are preloaded too, so that costs no imports.

Tasks carry a slice of images (tens, not one) to keep pickling and IPC cheap, and at most
``2 x workers`` tasks are in flight, so memory holds a few slices, never the dataset. Results
come back in submission order: the same input gives the same output order, hence the same bytes.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from multiprocessing import forkserver
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
from PIL import Image

from assets.kinds.image_decode import (
    encode_jpeg,
    inspect_image,
    load_function,
    preprocess_pixels,
    sample_shape,
)
from core.spec import ImagePreprocessing

MAX_IMAGES_PER_TASK = 64
_FUNCTIONS: dict[str, Callable] = {}  # the user's preprocessing function, imported once per worker


CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"  # cgroup v2: "<quota> <period>" or "max <period>"


def default_workers() -> int:
    """The CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota. A
    pod's CPU limit is that quota, and ``os.cpu_count()`` is the node's cores: a pool of that size
    in a 2-CPU pod on a 64-core node would run 64 processes on 2 CPUs' time, each holding images."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS)
        cpus = os.cpu_count() or 1
    try:
        with open(CGROUP_CPU_MAX) as f:
            quota = cpu_quota(f.read())
    except OSError:  # no cgroup v2 CPU controller here: the affinity is the limit
        quota = None
    return max(1, min(cpus, quota) if quota is not None else cpus)


def cpu_quota(cpu_max: str) -> int | None:
    """Whole CPUs a cgroup v2 ``cpu.max`` line allows, rounded up (None: no quota, "max")."""
    quota, _, period = cpu_max.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return max(1, -(-int(quota) // int(period)))


def workers_for(images: int, workers: int | None) -> int | None:
    """The pool for ``images``: none (0, this process) for at most one task's worth, which a pool
    would take longer to start (0.2-0.35 s) than to run; else ``workers``. An edit of a few files
    to a large folder then costs those files (benchmarks, row 8f)."""
    return 0 if images <= MAX_IMAGES_PER_TASK else workers


def task_size(images: int, workers: int) -> int:
    """Images per task: enough tasks for every worker, at most MAX_IMAGES_PER_TASK each."""
    return max(1, min(MAX_IMAGES_PER_TASK, -(-images // max(1, workers))))


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_preload_modules())  # read when the server starts (once per process)
    return ctx


def _preload_modules() -> list[str]:
    """This module, and, when the program is a script a worker re-runs on start, the modules that
    script took its names from (``python -m`` programs, such as pytest and Dagster's run workers,
    are not re-run)."""
    names = [__name__]
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None or not getattr(main, "__file__", None):
        return names
    for value in vars(main).values():
        module = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if isinstance(module, str) and module in sys.modules and not module.startswith("__") and module not in names:
            names.append(module)
    return names


class WorkerPool:
    """``with WorkerPool(n) as pool: for key, result in pool.ordered(fn, jobs)``.

    ``workers=0`` runs the tasks in this process (same functions, same results): for a caller that
    times the work alone or debugs it. Leaving the block, normally or by an exception, cancels
    what has not started and waits for the running tasks, so no worker outlives it.
    """

    def __init__(self, workers: int | None = None):
        self.workers = default_workers() if workers is None else workers
        self._executor: ProcessPoolExecutor | None = None

    def __enter__(self) -> "WorkerPool":
        if self.workers > 0:
            self._executor = ProcessPoolExecutor(self.workers, mp_context=_context(), initializer=_worker_signals)
            # The server starts now and imports while the caller reads its first input; left to
            # the first submit, which waits for the server's first fork, its start (0.2-0.35 s:
            # an interpreter and the preloaded modules) came after that reading, in series.
            forkserver.ensure_running()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def ordered(self, fn: Callable[[Any], Any], jobs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
        """``jobs`` are (key, task): yields (key, fn(task)) in their order, computed ``2 x workers``
        tasks ahead. The key stays in this process (what the caller needs back with the result)."""
        if self._executor is None:
            for key, task in jobs:
                yield key, fn(task)
            return
        pending: deque[tuple[Any, Future]] = deque()
        try:
            for key, task in jobs:
                try:
                    pending.append((key, self._executor.submit(fn, task)))
                except BrokenProcessPool as exc:  # a worker died since the last result was read
                    raise _died(exc) from exc
                if len(pending) >= 2 * self.workers:
                    yield _result(*pending.popleft())
            while pending:
                yield _result(*pending.popleft())
        finally:
            for _, future in pending:
                future.cancel()


def _worker_signals() -> None:
    """A worker dies on SIGTERM, whatever its host did with it. When a worker dies (killed for
    memory), the executor marks the pool broken and stops the others with ``terminate()``
    (SIGTERM), then joins them; a worker that ignores SIGTERM while it blocks writing a large
    result to a pipe nobody reads any more is then joined forever. Workers inherit the ignored
    signals of the process that started the forkserver, and a step's process may ignore SIGTERM:
    while Dagster executes it maps SIGTERM to SIGINT's handler (dagster/_utils/interrupts.py),
    and a process started in the background (``make ui &``, a test runner's worker) ignores
    SIGINT. CI caught a step hung this way."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _result(key: Any, future: Future) -> tuple[Any, Any]:
    try:
        return key, future.result()
    except BrokenProcessPool as exc:
        raise _died(exc) from exc


def _died(exc: BrokenProcessPool) -> RuntimeError:
    return RuntimeError("an image worker process died (killed for memory, or crashed in a native library); the pool "
                        f"stopped ({exc})")


# --- tasks (run in the workers) -----------------------------------------------------------------

InspectTask = tuple[list[bytes], list[str], "int | None"]  # contents, extensions, bomb limit


def inspect_task(task: InspectTask) -> list[tuple]:
    """``inspect_image`` over a slice: one (ImageInfo or None, problem or None) per image."""
    contents, extensions, max_pixels = task
    return [inspect_image(data, ext, max_pixels) for data, ext in zip(contents, extensions)]


PreprocessTask = tuple[ImagePreprocessing, list[str], list[bytes], "int | None"]  # prep, ids, contents, limit


def preprocess_task(task: PreprocessTask) -> np.ndarray | list[bytes]:
    """A slice of encoded images to uint8 (n, h, w, c) pixels, or to JPEG bytes when ``prep.encoded``."""
    prep, ids, contents, max_pixels = task
    function = None
    if prep.function is not None:
        if prep.function not in _FUNCTIONS:
            _FUNCTIONS[prep.function] = load_function(prep.function)
        function = _FUNCTIONS[prep.function]
    pixels = [preprocess_pixels(data, prep, image_id, max_pixels, function) for image_id, data in zip(ids, contents)]
    if prep.encoded:
        return [encode_jpeg(p, prep.jpeg_quality) for p in pixels]
    out = np.empty((len(pixels), *sample_shape(prep)), dtype=np.uint8)
    for i, p in enumerate(pixels):
        out[i] = p
    return out


def preprocess_tasks(prep: ImagePreprocessing, ids: Sequence[str], contents: Sequence[bytes],
                     workers: int) -> Iterator[PreprocessTask]:
    """``ids``/``contents`` cut into tasks sized for ``workers``."""
    step = task_size(len(contents), workers)
    limit = Image.MAX_IMAGE_PIXELS
    for start in range(0, len(contents), step):
        yield prep, list(ids[start:start + step]), list(contents[start:start + step]), limit


def preprocess_images(encoded: Sequence[bytes], prep: ImagePreprocessing,
                      workers: int | None = None) -> np.ndarray | list[bytes]:
    """Preprocess ``encoded`` images as the shards asset does, on ``workers`` processes (every core by
    default; 0: in this process). uint8 (n, h, w, c) pixels, or JPEG bytes with ``prep.encoded``.
    For timing the preprocessing alone (benchmarks) and for tests."""
    if prep.function is not None:
        load_function(prep.function)  # an import error is a clear ValueError here, not a dead worker
    ids = [f"#{i}" for i in range(len(encoded))]
    with WorkerPool(workers) as pool:
        jobs = ((None, task) for task in preprocess_tasks(prep, ids, encoded, pool.workers))
        parts = [out for _, out in pool.ordered(preprocess_task, jobs)]
    if prep.encoded:
        return [jpeg for part in parts for jpeg in part]
    return np.concatenate(parts) if parts else np.empty((0, *sample_shape(prep)), dtype=np.uint8)
