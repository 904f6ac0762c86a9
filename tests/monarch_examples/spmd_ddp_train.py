"""A torchrun-style DDP training script: Monarch's ``docs/source/examples/ddp/train.py``
on the CPU (``gloo``, where it uses ``nccl`` and CUDA). Each rank writes where it ran
and its model's parameters after training to ``--out DIR/rank<RANK>.json``."""

from __future__ import annotations

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])

    torch.manual_seed(rank)  # each rank its own start: DDP makes them one
    model = nn.Linear(10, 1)
    ddp_model = DDP(model)

    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)

    losses = []
    for step in range(5):
        inputs = torch.randn(4, 10)
        outputs = ddp_model(inputs)
        loss = outputs.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"[Rank {rank}] Step {step} loss={loss.item()}", flush=True)
        losses.append(loss.item())

    result = {
        "rank": rank,
        "local_rank": local_rank,
        "world_size": dist.get_world_size(),
        "host": socket.gethostname(),
        "steps": len(losses),
        "params": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
