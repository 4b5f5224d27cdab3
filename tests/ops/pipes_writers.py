"""Run as ``python -m tests.ops.pipes_writers PATH WRITER COUNT SEED``: append COUNT long Pipes
custom messages (Dagster's own format, as ``dagster_pipes`` makes them) to PATH, each line in
several pieces with a flush and a pause between them, so a reader tailing PATH sees lines still
being written. Writers hold an exclusive lock on the file for a whole line: real writers issue
one ``write`` per line (``O_APPEND``), which other writers' lines cannot cut into; the pauses
here only stretch the time in which the line is incomplete."""

from __future__ import annotations

import fcntl
import hashlib
import json
import random
import sys
import time

from dagster_pipes import _make_message


def payload(writer: int, index: int, rng: random.Random) -> dict:
    blob = "".join(rng.choices("abcdefghij \"\\é€", k=rng.randint(2_000, 60_000)))
    return {"kind": "telemetry", "writer": writer, "index": index, "blob": blob,
            "sha256": hashlib.sha256(blob.encode()).hexdigest()}


def main(path: str, writer: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    for index in range(count):
        line = (json.dumps(_make_message("report_custom_message", {"payload": payload(writer, index, rng)}))
                + "\n").encode()
        cuts = sorted(rng.sample(range(1, len(line)), k=min(len(line) - 1, rng.randint(2, 6))))
        with open(path, "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                for start, end in zip([0, *cuts], [*cuts, len(line)]):
                    f.write(line[start:end])
                    f.flush()
                    time.sleep(rng.uniform(0.0, 0.004))
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
