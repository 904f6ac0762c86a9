"""The actors and the remote function of Monarch's getting-started guide
(``docs/source/examples/getting_started.py``) that use torch: its sections
"Point-to-Point RDMA", "Distributed Tensors" and "Free Remote Functions". Where a test
needs to look at a result the guide only prints, an endpoint is added, and its
docstring says so.
"""

from __future__ import annotations

from typing import Any

import torch

from monarch_kernel import Actor, endpoint, remote
from monarch_kernel.rdma import RDMABuffer

# -- Point-to-Point RDMA --------------------------------------------------------------


class ParameterServer(Actor):
    def __init__(self) -> None:
        self.weights = torch.rand(1000, 1000)  # Large model weights

        # RDMABuffer does not copy the data. It just
        # creates a view of the data that can be passed to
        # other processes.
        self.weight_buffer = RDMABuffer(self.weights.view(torch.uint8).flatten())

    @endpoint
    def get_weights(self) -> RDMABuffer:
        return self.weight_buffer  # Small message: just a reference!

    @endpoint
    def weights_here(self) -> torch.Tensor:
        """Not in the guide: the server's weights, to compare with a worker's copy."""
        return self.weights


class Worker(Actor):
    def __init__(self) -> None:
        self.local_weights = torch.zeros(1000, 1000)

    @endpoint
    def sync_weights(self, server: Any) -> None:
        # Control plane: get lightweight reference
        weight_ref = server.get_weights.call_one().get()

        # Data plane: explicit bulk transfer when needed
        weight_ref.read_into(self.local_weights.view(torch.uint8).flatten()).get()

    @endpoint
    def weights_here(self) -> torch.Tensor:
        """Not in the guide: this worker's copy of the weights."""
        return self.local_weights


# -- Distributed Tensors --------------------------------------------------------------


class LinearActor(Actor):
    def __init__(self) -> None:
        self.w = torch.rand(3, 3)

    # The propagation function is like a type signature: the shape of the output,
    # given an input of a particular shape.
    @endpoint(propagate=lambda x: x)
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input @ self.w

    @endpoint
    def weights(self) -> torch.Tensor:  # (for the test to check rref's values)
        return self.w


# -- Free Remote Functions ------------------------------------------------------------


@remote
def check_memory() -> Any:
    import psutil

    return psutil.Process().memory_info()
