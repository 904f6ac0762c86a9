"""Monarch's ``monarch.spmd``: torchrun-style scripts on a mesh's procs.

``run_spmd(procs, ["train.py", "--lr", "0.1"])`` (``%mesh run train.py --lr 0.1`` in a
notebook) runs an unmodified script that reads torchrun's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ...) on every proc
of the mesh at once, as ``torchrun`` would on each host; what it prints shows under
each rank as it comes. It runs in the procs themselves (``runpy``, as Monarch's
``SPMDActor.main``), so it can run again, after an edit, on the same procs: the
script is read again, a new master port is picked, and a process group the last run
left is destroyed first. ``SPMDActor`` and ``setup_torch_elastic_env`` are Monarch's
building blocks, with its names and meanings.
"""

from __future__ import annotations

import math
import os
import runpy
import sys
from typing import Any

from monarch_kernel.actor import Actor, current_rank, current_size, endpoint
from monarch_kernel.errors import MeshSpecError
from monarch_kernel.mesh import Future, ProcMesh
from monarch_kernel.torch import master_address

#: The name of the actor mesh ``setup_torch_elastic_env`` and ``run_spmd`` spawn.
SPMD_ACTOR = "_SPMDActor"


class SPMDActor(Actor):
    """Sets torchrun's environment on its proc and runs scripts there. The last
    dimension of the mesh is the one within a host (``LOCAL_RANK``); the rank is
    the proc's rank in the whole mesh."""

    def __init__(self) -> None:
        point = current_rank()
        sizes = current_size()
        local = point.extent.labels[-1]
        self.rank = point.rank
        self.local_rank = point[local]
        self.local_world_size = sizes[local]
        self.world_size = math.prod(sizes.values())
        self.group_rank = self.rank // self.local_world_size
        self.group_world_size = -(-self.world_size // self.local_world_size)

    def _setup_env(self, master_addr: str, master_port: int) -> None:
        os.environ.update(
            {
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "RANK": str(self.rank),
                "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size),
                "GROUP_RANK": str(self.group_rank),
                "GROUP_WORLD_SIZE": str(self.group_world_size),
                "ROLE_RANK": str(self.rank),
                "ROLE_WORLD_SIZE": str(self.world_size),
                "ROLE_NAME": "rank",
                "WORLD_SIZE": str(self.world_size),
            }
        )

    @endpoint
    def get_host_port(self, use_ipaddr: Any = None) -> tuple[str, int]:
        """An address of this host the other procs reach (the one its worker listens
        on, whatever ``use_ipaddr`` asks: a host name may not resolve everywhere), and
        a free port on it."""
        return master_address()

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Sets torchrun's variables in this proc's environment."""
        self._setup_env(master_addr, master_port)

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Sets torchrun's variables, then runs ``script_args`` (``["train.py", ...]``
        or ``["-m", "module", ...]``) as ``__main__``. True once it returns (or exits
        with status 0); a non-zero exit raises ``RuntimeError`` with its status."""
        if not script_args or (script_args[0] == "-m" and len(script_args) < 2):
            raise ValueError("no script or module given: ['train.py', ...] or ['-m', 'module', ...]")
        self._setup_env(master_addr, master_port)
        _leave_process_group()  # a group the last run left would refuse this run's
        argv = sys.argv
        try:
            if script_args[0] == "-m":
                sys.argv = [script_args[1], *script_args[2:]]
                runpy.run_module(script_args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(script_args)
                runpy.run_path(script_args[0], run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise RuntimeError(f"{script_args[0]} exited with status {e.code}") from None
        finally:
            sys.argv = argv
            sys.stdout.flush()
            sys.stderr.flush()
        return True


def _leave_process_group() -> None:
    """Destroys torch.distributed's default group, if this proc is in one (only where
    torch was imported already: nothing else can have made one)."""
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _first(actors: Any, proc_mesh: ProcMesh) -> Any:
    return actors.slice(**dict.fromkeys(proc_mesh.sizes, 0))


def _check_master(master_addr: str | None, master_port: int | None) -> None:
    if (master_addr is None) != (master_port is None):
        raise MeshSpecError("give both master_addr and master_port, or neither (the first proc's are used)")


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
) -> None:
    """Sets torchrun's environment variables (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ...) on every proc of ``proc_mesh``; without a
    master, the first proc's host and a free port on it."""
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn(SPMD_ACTOR, SPMDActor)
    if master_addr is None:
        master_addr, master_port = _first(actors, proc_mesh).get_host_port.call_one(use_ipaddr).get()
    actors.setup_env.call(master_addr, master_port).get()


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
) -> None:
    """``setup_torch_elastic_env`` for async code (its waits do not block the loop)."""
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn(SPMD_ACTOR, SPMDActor)
    if master_addr is None:
        master_addr, master_port = await _first(actors, proc_mesh).get_host_port.call_one(use_ipaddr)
    await actors.setup_env.call(master_addr, master_port)


def run_spmd(proc_mesh: ProcMesh, script_args: list[str]) -> Future[Any]:
    """Runs the torchrun-style script ``script_args`` (``["train.py", "--lr",
    "0.1"]`` or ``["-m", "module", ...]``) on every proc of ``proc_mesh``, with a
    fresh master (the first proc's host, a new port); a ``Future`` of every proc's
    ``True``, or the failure of the ranks that raised or exited with a non-zero
    status. Run it again, after an edit, on the same procs."""
    if isinstance(script_args, str) or not script_args or not all(isinstance(a, str) for a in script_args):
        raise MeshSpecError(f"run_spmd: script_args must be a non-empty list of strings, not {script_args!r}")
    actors = proc_mesh.spawn(SPMD_ACTOR, SPMDActor)
    addr, port = _first(actors, proc_mesh).get_host_port.call_one(None).get()
    return actors.main.call(addr, port, list(script_args))


__all__ = ["SPMDActor", "run_spmd", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]
