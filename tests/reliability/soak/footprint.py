"""The soak's footprint: memory and process count of each part of the platform, and the disk its
state takes, sampled as it runs; and the bounds they must stay within.

Bounds (checked at the end, ``violations``):
- the long-lived processes (webserver, daemon and their code servers) hold at the end at most
  ``RSS_GROWTH`` times the memory they held a quarter into the soak (after warm-up), plus
  ``RSS_SLACK_MB`` for caches that fill once; a leak per run grows past that over many runs;
- once the soak has drained, no training process is left (none orphaned by a kill) and no
  checkpoint temporary (``.tmp-``, ``.trash-``) remains in the checkpoints of a training that
  ended in success (a resumed attempt clears those its killed predecessor left; a run that
  failed keeps its checkpoints, temporaries included, for a re-execution, and is only counted).
Disk grows with every version and run kept (nothing in the soak deletes them); its curve and
the bytes per finished run are reported.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RSS_GROWTH = 1.5
RSS_SLACK_MB = 150.0
MB = 1024 * 1024


def _tree(pid: int | None) -> list[psutil.Process]:
    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _rss_mb(procs: list[psutil.Process]) -> float:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue  # ended between listing and reading
    return round(total / MB, 1)


def _long_lived(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The root process and its code servers (not run workers, torchrun or ranks)."""
    keep = []
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "api execute_run" in cmd or "execute_run" in cmd or "training_runtime" in cmd or "torch" in cmd \
                or "resources.launch.supervise" in cmd:
            continue
        keep.append(p)
    return keep


def disk_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue  # removed while walking
    return total


@dataclass
class Footprint:
    platform: object  # SoakPlatform
    clock: object
    every_s: float = 30.0
    samples: list[dict] = field(default_factory=list)

    def sample(self) -> dict:
        p = self.platform
        groups = {"webserver": _tree(p.webserver.pid if p.webserver else None),
                  "daemon": _tree(p.daemon.pid if p.daemon else None),
                  "seaweedfs": _tree(p.seaweed.process.pid if p.seaweed and p.seaweed.process else None),
                  "soak (lakeFS test server, checks)": [psutil.Process()]}
        long_lived = _long_lived(groups["webserver"]) + _long_lived(groups["daemon"])
        row = {"at": self.clock.now(),
               "processes": sum(len(g) for g in groups.values()),
               "rss_mb": {name: _rss_mb(g) for name, g in groups.items()},
               "long_lived_rss_mb": _rss_mb(long_lived),
               "disk_mb": {"platform data": round(disk_bytes(p.data_root) / MB, 1),
                           "instance": round(disk_bytes(p.home) / MB, 1),
                           "lakeFS objects": round(disk_bytes(p.root / "lakefs") / MB, 1),
                           "S3 (SeaweedFS)": round(disk_bytes(p.root / "weed") / MB, 1)}}
        row["rss_mb_total"] = round(sum(row["rss_mb"].values()), 1)
        row["disk_mb_total"] = round(sum(row["disk_mb"].values()), 1)
        self.samples.append(row)
        return row

    def run(self, stop: threading.Event) -> None:
        self.sample()
        while not stop.wait(self.every_s):
            self.sample()

    def violations(self, data_root: Path, training_ranks, succeeded_roots: set[str]) -> list[str]:
        found = []
        if len(self.samples) >= 4:
            base = self.samples[len(self.samples) // 4]["long_lived_rss_mb"]
            end = self.samples[-1]["long_lived_rss_mb"]
            if end > base * RSS_GROWTH + RSS_SLACK_MB:
                found.append(f"the webserver's and daemon's long-lived processes grew from {base:.0f} MB (a quarter "
                             f"in) to {end:.0f} MB (more than {RSS_GROWTH}x + {RSS_SLACK_MB:.0f} MB)")
        left = training_ranks(data_root)
        if left:
            found.append(f"{len(left)} training process(es) still alive after the drain: "
                         + ", ".join(f"{r.model} rank {r.rank} pid {r.pid}" for r in left[:5]))
        temporaries = [p for p in leftover_temporaries(data_root)
                       if p.relative_to(data_root / "checkpoints").parts[1] in succeeded_roots]
        if temporaries:
            found.append(f"{len(temporaries)} checkpoint temporaries left by trainings that succeeded: "
                         f"{[str(p) for p in temporaries[:3]]}")
        return found


def leftover_temporaries(data_root: Path) -> list[Path]:
    root = data_root / "checkpoints"
    return sorted(p for p in root.rglob("*") if p.name.startswith((".tmp-", ".trash-"))) if root.is_dir() else []
