"""The same weights are the same bytes: model.safetensors, model_card.json and the lineage
record's canonical form hash the same in every process (safetensors 0.8 writes its header's
``__metadata__`` in hash-map order, which changes per process when it holds two keys or more)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

from training_runtime.serve.card import SAFETENSORS_METADATA

REPO = Path(__file__).resolve().parents[2]
PROCESSES = 6  # with two metadata keys, 6 processes gave 2 different hashes (1 in 32 to miss it)


def test_the_same_state_saved_in_fresh_processes_has_one_sha256_per_file(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-m", "tests.runtime.save_same_state", str(tmp_path / f"p{i}"),
                               str(i)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(PROCESSES)]
    hashes = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        hashes.append(json.loads(out.strip().splitlines()[-1]))
    for name in hashes[0]:
        assert len({h[name] for h in hashes}) == 1, (name, [h[name][:12] for h in hashes])
    # The header holds at most one metadata key; the card carries the rest.
    data = (tmp_path / "p0" / "model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    assert json.loads(data[8:8 + size])["__metadata__"] == SAFETENSORS_METADATA and len(SAFETENSORS_METADATA) <= 1
    card = json.loads((tmp_path / "p0" / "model_card.json").read_text())
    assert card["format"] == "model-factory.model-card/v1"
