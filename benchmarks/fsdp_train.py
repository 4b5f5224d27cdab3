"""Row 5e: per-rank peak memory of FSDP against DDP as a user launches it, through
``python -m pipelines train`` on a team's own model, the final save included.

A team's code location is written outside the repository (``loomteam``: a text dataset pipeline
of Python's bundled documentation topics, byte tokens, and a causal transformer language model of
its own block class, ``LoomBlock``, nothing the platform knows), listed beside the platform's in
a workspace.yaml, with an empty DAGSTER_HOME. Each sharding is one command a user types::

    python -m pipelines train loom_lm --workspace W --set train.epochs=1 --set train.sharding=fsdp

with no allocator setting of its own (MALLOC_MMAP_THRESHOLD_ is removed from the environment: what
the workers get, they get from the platform's launcher) and FSDP's default units. While it runs,
a thread reads every torchrun worker's ``/proc/<pid>/status`` (workers are the descendants whose
environment holds RANK): ``VmHWM``, the kernel's own high-water mark of the process's resident
memory, so the peak is exact whenever it happened (the validation's best-weights save, the
final checkpoint and the model's save at the end included), and ``VmRSS`` sampled every 50 ms,
apart before and after the first checkpoint file appears (a run of one epoch writes its first,
the best validation's weights, after its last step): the steps' peak and the saves' own. ``python -m benchmarks.fsdp_train --out FILE [--d-model ...]`` runs the
pair on its own and writes the JSON the row reads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEAM = "loomteam"
MODEL = "loom_lm"

MODEL_PY = '''"""The loom team's language model: a causal transformer of its own block class."""

import torch
from torch import nn


class LoomBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.norm1(x)
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class LoomLM(nn.Module):
    def __init__(self, seq_len: int, vocab: int, d: int, layers: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq_len, d))
        self.blocks = nn.ModuleList(LoomBlock(d, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def loom_lm(input_shape, num_classes, d_model: int = 1024, layers: int = 12, heads: int = 16):
    return LoomLM(input_shape[0], num_classes, d_model, layers, heads)
'''

DEFINITIONS_PY = '''"""The loom team's code location: its own text dataset and its own language model."""

from pipelines.api import TextCorpus, TextPreprocessing, dataset_pipeline, model_pipeline, team_definitions

loom_text = dataset_pipeline(
    "loom_text",
    source=TextCorpus(paths=("loom/*.txt",)),
    task="language_modeling",
    preprocessing=TextPreprocessing(tokenizer="byte", seq_len={seq_len}),
    team="loomteam",
    description="A few of Python's documentation topics as byte tokens.",
)

loom_lm = model_pipeline(
    "loom_lm",
    dataset="loom_text",
    task="language_modeling",
    model="loomteam.model:loom_lm",
    model_kwargs={{"d_model": {d_model}, "layers": {layers}, "heads": {heads}}},
    recipe={{"epochs": 1, "batch_size": {batch}, "lr": 0.0003, "world_size": 2}},
    team="loomteam",
    description="The loom team's causal transformer of its own block class.",
)

defs = team_definitions("loomteam", [loom_text, loom_lm])
'''


def write_location(root: Path, home: Path, a: argparse.Namespace) -> Path:
    """The team package under ``root``, its text under the home's sources, and the workspace."""
    package = root / "team-code" / TEAM
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(MODEL_PY)
    (package / "definitions.py").write_text(DEFINITIONS_PY.format(
        seq_len=a.seq, d_model=a.d_model, layers=a.layers, heads=a.heads, batch=2 * a.batch))
    from pydoc_data.topics import topics

    sources = home / "platform" / "sources" / "loom"
    sources.mkdir(parents=True)
    chars = 0
    # The shortest topics up to --chars characters: a few steps per epoch, and documents enough
    # for the dataset's validation and test splits (it splits by document).
    for name in sorted(topics, key=lambda t: (len(topics[t]), t)):
        if chars >= a.chars:
            break
        (sources / f"{name}.txt").write_text(topics[name])
        chars += len(topics[name])
    workspace = root / "workspace.yaml"
    workspace.write_text(
        "load_from:\n"
        "  - python_module:\n"
        "      module_name: pipelines.definitions\n"
        "      attribute: defs\n"
        "      location_name: platform\n"
        f"      working_directory: {REPO}\n"
        "  - python_module:\n"
        f"      module_name: {TEAM}.definitions\n"
        "      attribute: defs\n"
        f"      location_name: {TEAM}\n"
        f"      working_directory: {root / 'team-code'}\n")
    return workspace


# ---------------------------------------------------------------- the workers' memory
def _status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone between the listing and the read
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def _rank(pid: int) -> int | None:
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
    return int(env[b"RANK"]) if b"RANK" in env and b"TORCHELASTIC_RUN_ID" in env else None


class WorkerMemory:
    """Every torchrun worker below ``root_pid``: its rank, VmHWM, and its VmRSS sampled while
    ``saving`` is set."""

    def __init__(self, root_pid: int, home: Path, interval: float = 0.05):
        self.root, self.home, self.interval = root_pid, home, interval
        self.workers: dict[int, dict] = {}
        self.saving = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="worker-memory")

    def _descendants(self) -> list[int]:
        kids, out, todo = _children(), [], [self.root]
        while todo:
            pid = todo.pop()
            for k in kids.get(pid, []):
                out.append(k)
                todo.append(k)
        return out

    def _sample(self) -> None:
        for pid in self._descendants():
            try:
                w = self.workers.get(pid)
                if w is None:
                    rank = _rank(pid)
                    if rank is None:
                        continue
                    w = self.workers[pid] = {"pid": pid, "rank": rank, "hwm": 0, "rss": 0, "anon": 0,
                                             "rss_in_save": 0, "rss_in_steps": 0}
                s = _status(pid)
            except (OSError, ValueError):
                continue  # the process ended between the listing and the read: its last reading stands
            w["hwm"] = max(w["hwm"], s.get("VmHWM", 0))
            w["rss"] = max(w["rss"], s.get("VmRSS", 0))
            w["anon"] = max(w["anon"], s.get("RssAnon", 0))
            phase = "rss_in_save" if self.saving.is_set() else "rss_in_steps"
            w[phase] = max(w[phase], s.get("VmRSS", 0))

    def _saves_began(self) -> bool:
        """A checkpoint (the best weights' or the run's, being written or published) exists: the
        steps are over (a run of one epoch checkpoints first after its last step, at its validation)."""
        return any(p.name.startswith((".tmp-step_", "step_")) for p in self.home.rglob("*step_*"))

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            if not self.saving.is_set() and self.workers and n % 4 == 0 and self._saves_began():
                self.saving.set()
            self._sample()
            n += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> "WorkerMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- one command
def _tree_bytes(paths: list[Path]) -> int:
    return sum(f.stat().st_size for p in paths for f in p.rglob("*") if f.is_file())


def train(workspace: Path, home: Path, sharding: str, timeout: float) -> dict:
    """``python -m pipelines train`` with ``sharding``; its workers' memory and what it left."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DAGSTER_HOME", "PLATFORM_PROFILE", "PYTHONPATH", "MALLOC_MMAP_THRESHOLD_")
           and not k.startswith("DAGSTER_PIPES")}
    env.update(DAGSTER_HOME=str(home), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "pipelines", "train", MODEL, "--workspace", str(workspace),
           "--set", "train.epochs=1", "--set", f"train.sharding={sharding}"]
    t0 = time.perf_counter()
    lines: list[str] = []
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with WorkerMemory(proc.pid, home) as mem:
        deadline = time.monotonic() + timeout
        for line in proc.stdout:
            lines.append(line)
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{' '.join(cmd)} ran past {timeout:.0f} s")
        rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}: {''.join(lines)[-3000:]}")
    ranks: dict[int, dict] = {}
    for w in mem.workers.values():  # one launch: one process per rank (a restart would add one)
        r = ranks.setdefault(w["rank"], {"peak_rss_bytes": 0, "sampled_rss_bytes": 0, "peak_anon_bytes": 0,
                                         "save_rss_bytes": 0, "steps_rss_bytes": 0, "processes": 0})
        r["peak_rss_bytes"] = max(r["peak_rss_bytes"], w["hwm"])
        r["sampled_rss_bytes"] = max(r["sampled_rss_bytes"], w["rss"])
        r["peak_anon_bytes"] = max(r["peak_anon_bytes"], w["anon"])
        r["save_rss_bytes"] = max(r["save_rss_bytes"], w["rss_in_save"])
        r["steps_rss_bytes"] = max(r["steps_rss_bytes"], w["rss_in_steps"])
        r["processes"] += 1
    metrics = sorted(home.rglob("metrics.json"), key=lambda p: p.stat().st_mtime)
    m = json.loads(metrics[-1].read_text()) if metrics else {}
    resolved = sorted(home.rglob("resolved_config.json"), key=lambda p: p.stat().st_mtime)
    config = json.loads(resolved[-1].read_text()) if resolved else {}
    ckpt_dirs = [p for p in home.rglob("step_*") if p.is_dir() and p.parent.name != "best"]
    best_dirs = [p for p in home.rglob("step_*") if p.is_dir() and p.parent.name == "best"]
    weights = sorted(home.rglob("model.safetensors"), key=lambda p: p.stat().st_mtime)
    return {"sharding": sharding, "command": " ".join(["python", *cmd[1:]]), "wall_s": wall,
            "ranks": {str(k): v for k, v in sorted(ranks.items())},
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks.values()),
            "steps": m.get("steps"), "per_rank_step_time_s": m.get("per_rank_step_time_s"),
            # the slowest rank's mean step time (metrics.json's per_rank_step_time_s)
            "step_time_s": max(m["per_rank_step_time_s"]) if m.get("per_rank_step_time_s") else None,
            "world_size": config.get("world_size"), "train": config.get("train", {}),
            "wrapping": config.get("wrapping"),
            "checkpoints": {"count": len(ckpt_dirs), "bytes": _tree_bytes(ckpt_dirs),
                            "best_bytes": _tree_bytes(best_dirs)},
            "model_bytes": weights[-1].stat().st_size if weights else None,
            "log_tail": "".join(lines)[-2500:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=None, help="where the homes go (default: a temporary folder)")
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128, help="tokens per sample")
    ap.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    ap.add_argument("--chars", type=int, default=12000, help="characters of text (steps per epoch)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--order", default="ddp,fsdp")
    a = ap.parse_args(argv)
    runs = {}
    with tempfile.TemporaryDirectory(dir=a.work, prefix="fsdp-train-") as tmp:
        for sharding in a.order.split(","):
            root = Path(tmp) / sharding
            home = root / "dagster-home"
            home.mkdir(parents=True)
            (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
            workspace = write_location(root, home, a)
            runs[sharding] = train(workspace, home, sharding, a.timeout)
            shutil.rmtree(root, ignore_errors=True)  # gigabytes of checkpoints: gone before the next run
    result = {"model": {"d_model": a.d_model, "layers": a.layers, "heads": a.heads, "seq": a.seq,
                        "batch_per_rank": a.batch, "chars": a.chars}, "runs": runs}
    a.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v["peak_rss_bytes"] for k, v in runs.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
