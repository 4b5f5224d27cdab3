"""A separate process that writes its own branch and publishes it, like one pipeline run.

Usage: python -m tests.support.store_workers SPEC_JSON
SPEC: {"kind", "settings", "branch", "files": {path: text}, "start_file"}
Prints one JSON line: {"status": "merged", "head": ...} or {"status": "conflict", "paths": [...]}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from resources.store.base import MAIN, MergeConflictError
from resources.store.factory import make_store


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


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)
