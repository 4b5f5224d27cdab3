"""Supervise one local torchrun: ``python -m resources.launch.supervise --lock FILE -- CMD...``.

Two guarantees the bare subprocess lacks, both needed for "a retry resumes from the checkpoint":
- when the run worker that started us dies (SIGKILL, OOM), the whole torchrun process group is
  ended instead of training on as an orphan beside the retry;
- one training at a time per checkpoint directory: a retry waits for the lock of its
  predecessor's (dying) workers rather than writing the same checkpoints concurrently.
Stdlib only: it runs before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import time


def _end_group(proc: subprocess.Popen, grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is not None:
            return


def _acquire(lock_path: str, wait_s: float) -> int:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                sys.exit(f"supervise: another training still holds {lock_path} after {wait_s:.0f} s; "
                         "wait for it to end or stop it, then retry")
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resources.launch.supervise")
    parser.add_argument("--lock", required=True, help="lock file of the checkpoint directory")
    parser.add_argument("--lock-wait-s", type=float, default=120.0)
    parser.add_argument("--grace-s", type=float, default=10.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    parent = os.getppid()
    lock_fd = _acquire(args.lock, args.lock_wait_s)
    # Its own process group, so ending it reaches torchrun's workers too.
    proc = subprocess.Popen(command, start_new_session=True)

    def forward(signum, _frame):  # a cancelled run: pass the signal on to the group
        _end_group(proc, args.grace_s)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        while proc.poll() is None:
            if os.getppid() != parent:  # the run worker is gone
                print("supervise: the process that launched training died; ending training", file=sys.stderr)
                _end_group(proc, args.grace_s)
                return 1
            time.sleep(0.2)
        return proc.returncode
    finally:
        os.close(lock_fd)


if __name__ == "__main__":
    sys.exit(main())
