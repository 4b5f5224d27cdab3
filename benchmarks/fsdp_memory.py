"""Per-rank peak memory of a user's own model under DDP, FSDP and FSDP with activation
checkpointing: ``torchrun --nproc-per-node=2 -m benchmarks.fsdp_memory --mode fsdp --out FILE``.

The model is a decoder-style transformer built from its own block class (``UserBlock``: nothing
the platform knows), wrapped by ``training_runtime.distributed.fsdp.wrap_model`` as the runtime
wraps a pipeline's model: under FSDP its units come from the size-based policy
(``training_runtime.distributed.units``), with ``--units`` from class names instead. Each rank
first takes one AdamW step on a single short sequence, which creates the gradients and the
optimizer's moments, then ``--steps`` steps of ``--batch`` sequences of ``--seq`` tokens, the
measured ones; a thread samples the rank's resident memory from just after wrapping (the full
model every rank builds first is not counted) to the end. Rank 0 writes every rank's figures
to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.common import PeakMemory


def build_model(d: int, layers: int, vocab: int, heads: int):
    import torch
    from torch import nn

    class UserBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            h = self.norm1(x)
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.norm2(x))

    class UserLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(UserBlock() for _ in range(layers))
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return UserLM()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("ddp", "fsdp", "fsdp_ac"), required=True)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per measured step")
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--steps", type=int, default=1, help="measured steps, after one short first step")
    ap.add_argument("--units", default="", help="FSDP unit class names (default: the size-based policy)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch import nn

    from training_runtime.distributed.fsdp import wrap_model
    from training_runtime.distributed.process_group import close_distributed, init_distributed
    from training_runtime.distributed.units import fsdp_units, parse_unit_names

    info = init_distributed(device="cpu")
    torch.manual_seed(0)
    model = build_model(a.d_model, a.layers, a.vocab, a.heads)
    params = sum(p.numel() for p in model.parameters())
    units = len(fsdp_units(model, parse_unit_names(a.units))) if a.mode != "ddp" else 0
    wrapped = wrap_model(model, "ddp" if a.mode == "ddp" else "fsdp", info, units=parse_unit_names(a.units),
                         activation_checkpointing=a.mode == "fsdp_ac")
    del model
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(info.rank)
    step_s = []
    with PeakMemory(interval=0.01) as mem:
        for i in range(a.steps + 1):
            shape = (1, 9) if i == 0 else (a.batch, a.seq + 1)  # the first: gradients and moments exist after it
            tokens = torch.randint(0, a.vocab, shape, generator=gen)
            t0 = time.perf_counter()
            logits = wrapped(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i:
                step_s.append(time.perf_counter() - t0)
    mine = {"rank": info.rank, "peak_rss_bytes": mem.peak_rss, "peak_anon_bytes": mem.peak_anon,
            "start_rss_bytes": mem.start_rss, "step_s": step_s, "loss": loss.item()}
    everyone = [None] * info.world_size
    dist.all_gather_object(everyone, mine)
    if info.rank == 0:
        a.out.write_text(json.dumps({"mode": a.mode, "parameters": params, "units": units, "ranks": everyone,
                                     "world_size": info.world_size, "batch_per_rank": a.batch, "seq": a.seq,
                                     "threads": torch.get_num_threads(),
                                     "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_")}))
    close_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
