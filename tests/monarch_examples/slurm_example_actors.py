"""The actors of Monarch's SLURM notebooks (``examples/slurm_allreduce.ipynb`` with
``examples/example_actors/compute_world_size_actor.py``, and ``examples/slurm_ddp.ipynb``),
written for this project, on the CPU: ``gloo`` where the notebooks use ``nccl`` and
CUDA devices. Where a test needs a result the notebooks only print, an endpoint
returns it, and its docstring says so.
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

from monarch_kernel import Actor, current_rank, current_size, endpoint

# -- slurm_allreduce.ipynb ------------------------------------------------------------


class _HostnameActor(Actor):
    """Helper actor to get hostname from rank 0"""

    @endpoint
    def get_hostname(self) -> str:
        return socket.gethostname()


class ComputeWorldSizeActor(Actor):
    """Silly actor that computes the world size by all-reducing rank-hot tensors"""

    @endpoint
    async def compute_world_size(self, master_addr: str, master_port: int) -> int:
        rank: int = current_rank().rank
        world_size: int = math.prod(current_size().values())

        backend = "gloo"  # the notebook's nccl, on the CPU
        os.environ["MASTER_ADDR"] = master_addr
        os.environ["MASTER_PORT"] = str(master_port)

        print(
            f"Initializing process group `{backend}`:\n"
            f"  MASTER_ADDR = {master_addr}\n  MASTER_PORT = {master_port}\n"
            f"  RANK        = {rank}\n  WORLD_SIZE  = {world_size}",
            flush=True,
        )

        dist.init_process_group(backend, rank=rank, world_size=world_size)

        try:
            t = F.one_hot(torch.tensor(rank), num_classes=dist.get_world_size())
            dist.all_reduce(t)
            return int(torch.sum(t).item())
        finally:
            dist.destroy_process_group()


# -- slurm_ddp.ipynb ------------------------------------------------------------------


class ToyModel(nn.Module):
    """A simple toy model for demonstration purposes."""

    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def _flat(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


class DDPActor(Actor):
    """Torch's basic DDP example as endpoints (the notebook's ``DDPActor``)."""

    def __init__(self) -> None:
        self.rank = current_rank().rank

    def _rprint(self, msg: str) -> None:
        """Helper method to print with rank information."""
        print(f"{self.rank=} {msg}", flush=True)

    @endpoint
    async def setup(self) -> None:
        """Initialize the PyTorch distributed process group."""
        self._rprint("Initializing torch distributed")

        WORLD_SIZE = int(os.environ["WORLD_SIZE"])
        # initialize the process group
        dist.init_process_group("gloo", rank=self.rank, world_size=WORLD_SIZE)
        self._rprint("Finished initializing torch distributed")

    @endpoint
    async def cleanup(self) -> None:
        """Clean up the PyTorch distributed process group."""
        self._rprint("Cleaning up torch distributed")
        dist.destroy_process_group()

    @endpoint
    async def demo_basic(self) -> dict[str, Any]:
        """Run a basic DDP training example (on the CPU: the notebook moves the model
        to GPU ``LOCAL_RANK``). Returns what the notebook only prints: where it ran,
        and the parameters after DDP's start (rank 0's, broadcast) and after a step."""
        self._rprint("Running basic DDP example")

        local_rank = int(os.environ["LOCAL_RANK"])
        self._rprint(f"{local_rank=}")
        torch.manual_seed(self.rank)  # each rank its own start: DDP must make them one
        model = ToyModel()
        ddp_model = DDP(model)
        started = _flat(model)

        loss_fn = nn.MSELoss()
        optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss_fn(outputs, labels).backward()
        optimizer.step()

        print(f"{self.rank=} Finished running basic DDP example", flush=True)
        return {
            "rank": self.rank,
            "local_rank": local_rank,
            "world_size": dist.get_world_size(),
            "host": socket.gethostname(),
            "started": started,
            "stepped": _flat(model),
        }
