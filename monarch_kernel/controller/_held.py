"""What a session is to the parts of the controller it holds (its supervisor):
``HeldMesh``, a protocol ``Session`` satisfies (front ends see less of it:
``MeshSession``). Those modules take this, not ``Session``, so that they and the session's
module do not import each other (not even for types)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from monarch_kernel.control import AgentGroup
from monarch_kernel.hosts import MeshRecord
from monarch_kernel.mesh import MeshFailure, MeshState


class HeldMesh(Protocol):
    """A mesh this process holds (``Session``): what its supervisor uses."""

    name: str
    token: str
    rec: MeshRecord
    client: AgentGroup
    state: MeshState
    epoch: int
    closed: bool
    stopping: bool
    fenced: bool
    callbacks: list[Callable[[MeshFailure], Any]]
    records: dict[str, tuple[bytes, list[bytes], bytes]]
    #: Hosts that do not answer now, and hosts whose agent is gone, by link index (SUPERVISE-4).
    unreachable: set[int]
    lost_hosts: set[int]

    @property
    def nprocs(self) -> int: ...

    def host_index(self, rank: int) -> int: ...

    def explain_host_loss(self, wait: float = 0.0, host: str | None = None) -> str | None: ...

    def forget_record(self) -> None: ...

    def detach(self) -> None: ...


__all__ = ["HeldMesh"]
