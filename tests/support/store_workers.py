"""A separate process that writes its own branch and publishes it, like one pipeline run.

Usage: python -m tests.support.store_workers < SPEC_JSON   (stdin, so secrets stay out of argv)
SPEC: {"kind", "settings", "branch", "files": {path: text}, "start_file"}
Prints one JSON line: {"status": "merged", "head": ...} or {"status": "conflict", "paths": [...]}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from resources.store.base import MAIN, MergeConflictError, VersionedStore
from resources.store.factory import make_store

REPO_ROOT = Path(__file__).resolve().parents[2]


def run(spec: dict) -> dict:
    store = make_store(spec["kind"], **spec["settings"])
    branch = spec["branch"]
    store.create_branch(branch, MAIN)
    start = Path(spec["start_file"])
    # Both workers wait at the same gate so their writes and merges really overlap.
    while not start.exists():
        time.sleep(0.01)
    for path, text in spec["files"].items():
        store.put_object(branch, path, text.encode())
    store.commit(branch, f"write {branch}", metadata={"writer": branch})
    try:
        head = store.merge(branch, MAIN, message=f"publish {branch}", metadata={"writer": branch})
    except MergeConflictError as exc:
        return {"status": "conflict", "paths": exc.paths}
    return {"status": "merged", "head": head}


def run_writers_at_once(store: VersionedStore, kind: str, settings: dict, gate_dir: Path,
                        writers: dict[str, dict[str, str]]) -> dict[str, dict]:
    """Start one worker process per branch; release them together; return their results."""
    start = gate_dir / "go"
    procs = {}
    for branch, files in writers.items():
        spec = {"kind": kind, "settings": settings, "branch": branch, "files": files, "start_file": str(start)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.store_workers"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        proc.stdin.write(json.dumps(spec))
        proc.stdin.close()
        procs[branch] = proc
    try:
        # Open the gate once every worker has created its branch.
        while not set(writers) <= set(store.list_branches()):
            for branch, proc in procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {branch} exited early: {proc.stderr.read()}")
            time.sleep(0.02)
        start.touch()
        results = {}
        for branch, proc in procs.items():
            out, err = proc.stdout.read(), proc.stderr.read()
            if proc.wait(timeout=300) != 0:
                raise RuntimeError(f"worker {branch} failed: {err}")
            results[branch] = json.loads(out)
        return results
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.stdin.read()))), flush=True)
