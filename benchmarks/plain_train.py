"""Plain DDP training for benchmarks.plain_pipeline (run under torchrun): the runtime's MLP shape,
AdamW, cosine schedule, DistributedSampler-style shards of each epoch, then test/validation
accuracy on rank 0. Writes result.json into --data."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.from_numpy(np.load(a.data / "train_x.npy"))
    y = torch.from_numpy(np.load(a.data / "train_y.npy"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(x.shape[1], 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    local = a.batch // world
    per_rank = math.ceil(len(y) / world)
    steps_per_epoch = math.ceil(per_rank / local)
    total = a.epochs * steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    t0 = time.perf_counter()
    for epoch in range(a.epochs):
        order = torch.from_numpy(np.random.default_rng([0, epoch]).permutation(len(y)))
        order = torch.cat([order, order[: per_rank * world - len(y)]])[rank::world]
        for s in range(0, len(order), local):
            idx = order[s:s + local]
            loss = F.cross_entropy(ddp(x[idx]), y[idx])
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
    train_s = time.perf_counter() - t0
    if rank == 0:
        model.eval()
        acc = {}
        with torch.no_grad():
            for split in ("test", "validation"):
                tx = torch.from_numpy(np.load(a.data / f"{split}_x.npy"))
                ty = torch.from_numpy(np.load(a.data / f"{split}_y.npy"))
                acc[split] = float((model(tx).argmax(1) == ty).float().mean())
        (a.data / "result.json").write_text(json.dumps({"train_s": train_s, "steps": total,
                                                        "accuracy": acc}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
