"""torch.distributed on a proc mesh (``ProcMesh.setup_torch_distributed``)."""

from monarch_kernel.torch._distributed import (
    BACKENDS,
    DIST_ACTOR,
    TorchDistributed,
    master_address,
    rejoin,
    setup,
)

__all__ = ["BACKENDS", "DIST_ACTOR", "TorchDistributed", "master_address", "rejoin", "setup"]
