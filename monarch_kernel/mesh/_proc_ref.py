"""``ProcRef``: how to reach the procs of one mesh (addresses, token, agent), and how
to explain a failed call in terms a user can act on."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from monarch_kernel import _native
from monarch_kernel.errors import (
    MeshAuthError,
    MeshStoppedError,
    MessageTooLargeError,
    MonarchKernelError,
    SupervisionError,
)
from monarch_kernel.mesh._shape import Extent, Point

# Proc meshes this process stopped, by name: their calls fail as MeshStoppedError.
_stopped: set[str] = set()


@dataclass(frozen=True)
class ProcRef:
    """Addresses of a mesh's procs (by proc rank), its token, and its host agent's address."""

    name: str
    token: str = field(repr=False)
    addrs: tuple[str, ...]
    agent_addr: str | None = None
    #: The dims of the whole proc mesh (proc ranks index it).
    extent: Extent = Extent([], [])

    def point(self, rank: int) -> Point:
        """Proc ``rank`` as a point of the whole proc mesh, e.g. ``{'procs': 2/4}``."""
        return (
            Point(rank, self.extent) if self.extent.nelements == len(self.addrs) else Point(0, Extent([], []))
        )

    def conns(self, ranks: Sequence[int]) -> list[Any]:
        if self.name in _stopped:
            raise MeshStoppedError(
                f"proc mesh {self.name!r} has been stopped; spawn a new one with this_host().spawn_procs(...)",
                mesh=self.name,
            )
        return [_native.WorkerConn(self.addrs[r], self.token) for r in ranks]

    def _worker(self, rank: int, wait_exit: float) -> dict[str, Any] | None:
        """What the agent knows of worker ``rank``, waiting up to ``wait_exit`` s for its exit to be recorded."""
        if self.agent_addr is None:
            return None
        from monarch_kernel.control import agent_client

        try:
            client = agent_client(self.agent_addr, self.token)
            deadline = time.monotonic() + wait_exit
            while True:
                info = client.worker(rank)
                if info is None or info["state"] == "exited" or time.monotonic() >= deadline:
                    break
                time.sleep(0.02)
            if info is not None:
                info["log_tail"] = [ln for ln in client.logs(rank=rank, tail=10)]
            return info
        except MonarchKernelError:
            return None

    def explain(self, exc: BaseException, rank: int, what: str) -> BaseException:
        """Turns a native failure of a call to proc ``rank`` into the error a user sees."""
        if isinstance(exc, _native.MessageTooLarge):
            return MessageTooLargeError(f"{what}: {exc}")
        if isinstance(exc, _native.AuthError):
            return MeshAuthError(f"{what}: mesh {self.name!r} rejected the token: {exc}")
        if self.name in _stopped:
            return MeshStoppedError(
                f"{what} failed: proc mesh {self.name!r} has been stopped", mesh=self.name
            )
        if isinstance(exc, _native.ConnectionLost):
            return self.lost(rank, what, str(exc))
        return SupervisionError(
            f"{what} failed on rank {rank} of mesh {self.name!r}: {exc}", mesh=self.name, rank=rank
        )

    def lost(self, rank: int, what: str, cause: str) -> SupervisionError:
        info = self._worker(rank, wait_exit=1.0)
        if info is None:
            return SupervisionError(
                f"{what} failed: the worker of rank {rank} of mesh {self.name!r} is gone ({cause})",
                mesh=self.name,
                rank=rank,
                endpoint=what,
            )
        if info["state"] == "exited":
            how = (
                f"was killed by signal {info['signal']} ({info['signal_name']})"
                if info["signal"]
                else f"exited with code {info['exit_code']}"
            )
        else:
            how = f"stopped answering ({cause})"
        tail = info.get("log_tail") or []
        last = ("; its last output:\n    " + "\n    ".join(tail)) if tail else "; it wrote no output"
        return SupervisionError(
            f"{what} failed: the worker of rank {rank} of mesh {self.name!r} (pid {info['pid']} on "
            f"{info['host']}) {how}{last}\nThe other ranks keep running.",
            mesh=self.name,
            rank=rank,
            host=info["host"],
            pid=info["pid"],
            exit_code=info["exit_code"] if info["state"] == "exited" and not info["signal"] else None,
            signal=info["signal"] or None,
            log_tail=tail,
            endpoint=what,
        )

    def rejected(self, message: str, rank: int, what: str) -> SupervisionError:
        return MeshStoppedError(
            f"{what} on rank {rank} of mesh {self.name!r}: {message}", mesh=self.name, rank=rank
        )
