"""torch.distributed on a proc mesh: ``procs.setup_torch_distributed(backend)``.

DIST-1: the controller asks the mesh's first proc for a free port on its host, then
every proc sets ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` in its environment and calls ``init_process_group`` on the thread of a
built-in actor, ``__torch_dist__``, through a TCPStore whose timeout bounds the join
(collectives keep torch's default timeout). The process group is process-wide, so
``%%mesh`` cells and every actor on the proc use it afterwards. If every proc is
already in one group of this shape, nothing happens (calling again is a no-op);
otherwise every proc leaves its group and joins a new one (after a respawn, say). A
proc that does not answer or join within ``timeout`` seconds is named in the error;
so is one that raised.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from monarch_kernel.actor import Actor, endpoint
from monarch_kernel.errors import ActorError, DistributedSetupError, SupervisionError
from monarch_kernel.hosts import GPUS_ENV
from monarch_kernel.mesh import Point, ProcMesh, Shape, current_proc

if TYPE_CHECKING:
    from monarch_kernel.mesh import MeshControl

#: The name of the built-in actor mesh that sets torch.distributed up.
DIST_ACTOR = "__torch_dist__"
BACKENDS = ("gloo", "nccl", "auto")


def master_address() -> tuple[str, int]:
    """An address of this host that the mesh's other procs can reach (on a worker, the
    one it listens on; elsewhere, the host's name) and a free port on it, for a
    rendezvous (DIST-1, and torchrun's ``MASTER_ADDR``/``MASTER_PORT`` in
    ``monarch_kernel.spmd``)."""
    me = current_proc()  # a worker knows itself from its start
    host = socket.gethostname() if me is None else me._proc.addrs[0].rsplit(":", 1)[0].strip("[]")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return host, int(s.getsockname()[1])


class TorchDistributed(Actor):
    """Runs on every proc of a mesh whose torch.distributed the controller sets up."""

    @endpoint
    def master(self) -> tuple[str, int]:
        """An address of this host the other procs can reach, and a free port on it."""
        return master_address()

    @endpoint
    def state(self) -> dict[str, Any] | None:
        """This proc's process group (backend, rank, world size, master), or None."""
        # torch first, then its submodule: ``import torch.distributed`` alone takes the
        # submodule's import lock before torch's, and deadlocks (then aborts the
        # process) against another thread importing torch, which imports it back.
        import torch  # noqa: F401
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        return {
            "backend": str(dist.get_backend()),
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
        }

    @endpoint
    def init(self, backend: str, addr: str, port: int, ranks: list[int], timeout: float) -> dict[str, Any]:
        """Joins a new group (leaving any this proc is in: the controller asks only
        when some rank needs one, and then every rank joins the new one)."""
        import torch
        import torch.distributed as dist

        me = int(os.environ["MONARCH_RANK"])
        rank, world = ranks.index(me), len(ranks)
        if dist.is_initialized():
            dist.destroy_process_group()
        placed = bool(os.environ.get(GPUS_ENV))  # PLACE-1: this proc has a GPU of its own
        if backend == "auto":
            backend = "nccl" if placed and torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    "backend 'nccl' needs a GPU, and this proc has none "
                    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); use 'gloo'"
                )
            local = int(os.environ.get("LOCAL_RANK", rank))
            torch.cuda.set_device(0 if placed else local % torch.cuda.device_count())
        os.environ.update(
            MASTER_ADDR=addr,
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=os.environ.get("LOCAL_RANK", str(rank)),
        )
        t = time.perf_counter()
        # The join is bounded by the store's timeout; collectives keep torch's default
        # timeout (a rank paused in pdb for a minute must not abort the group).
        store = dist.TCPStore(
            addr, port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=timeout)
        )
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
        return {
            "backend": backend,
            "rank": rank,
            "world_size": world,
            "master": f"{addr}:{port}",
            "new": True,
            "s": time.perf_counter() - t,
        }


def setup(session: MeshControl, procs: ProcMesh, backend: str, timeout: float) -> dict[str, Any]:
    """``ProcMesh.setup_torch_distributed`` on ``procs``, whose controlling session is
    ``session``: see the module docstring."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, not {backend!r}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    states = procs.status()
    down = [r for r in procs._shape.ranks if states[r] != "alive"]
    if down:
        raise DistributedSetupError(
            f"torch.distributed on mesh {procs.name!r}: rank(s) {down} are not alive "
            f"({', '.join(states[r] for r in down)}); procs.respawn() first"
        )
    # The actor lives on every proc of the mesh; a slice's procs are picked by their
    # rank in the whole mesh.
    whole = Shape.of(session.sizes)
    if DIST_ACTOR in session.records:
        actors = procs.actors[DIST_ACTOR]
    else:
        try:
            actors = ProcMesh(procs._proc, whole).spawn(DIST_ACTOR, TorchDistributed)
        except SupervisionError as e:
            raise DistributedSetupError(
                f"torch.distributed on mesh {procs.name!r}: rank {e.rank} did not start its part: {e}"
            ) from e
    ranks = list(procs._shape.ranks)
    one = [actors.slice(**dict(Point(r, whole.extent))) for r in ranks]
    # Where each rank stands (this also imports torch everywhere, the slow part).
    now = _each([a.state.call_one() for a in one], max(timeout, 5.0))
    _raise_for(procs, backend, ranks, now, "did not answer (busy, stopped or hung?)", timeout, "")
    if all(
        g is not None
        and g["rank"] == i
        and g["world_size"] == len(ranks)
        and g["master"] == now[0]["master"]  # one group, not several of the same size
        and backend in ("auto", g["backend"])
        for i, g in enumerate(now)
    ):
        return {
            "backend": now[0]["backend"],
            "world_size": len(ranks),
            "master": now[0]["master"],
            "new": False,
        }
    addr, port = one[0].master.call_one().get(timeout=30)
    # The ranks give up by themselves after `timeout`; a rank that never answers is named.
    results = _each([a.init.call_one(backend, addr, port, ranks, float(timeout)) for a in one], timeout + 5.0)
    where = f" (MASTER_ADDR={addr}, MASTER_PORT={port}, WORLD_SIZE={len(ranks)})"
    _raise_for(procs, backend, ranks, results, "did not join", timeout, where)
    return {
        "backend": results[0]["backend"],
        "world_size": len(ranks),
        "master": f"{addr}:{port}",
        "new": any(r["new"] for r in results),
    }


def rejoin(session: MeshControl, procs: ProcMesh, respawned: list[int], timeout: float = 60.0) -> str | None:
    """After ``respawned`` ranks were restarted on a mesh whose torch.distributed was
    set up: sets it up again for the whole group (every rank leaves the old group,
    which the dead rank broke, and joins a new one), with the group's backend. Returns
    None when done, or why it did not (the survivors' groups are slices of the mesh:
    then each slice's setup is to be called again)."""
    whole = Shape.of(session.sizes)
    survivors = [r for r in whole.ranks if r not in respawned]
    backend = "auto"
    if survivors:
        actors = procs.actors[DIST_ACTOR]
        state = actors.slice(**dict(Point(survivors[0], whole.extent))).state.call_one().get(timeout=timeout)
        if state is None or state["world_size"] != len(whole.ranks):
            return (
                f"rank {survivors[0]}'s process group is not the whole mesh's; call "
                "setup_torch_distributed() again on each slice that had one"
            )
        backend = state["backend"]
    setup(session, ProcMesh(procs._proc, whole), backend, timeout)
    return None


class _Silent:
    """A rank that did not answer in time."""


def _each(futures: list[Any], within: float) -> list[Any]:
    """Each future's value, its ActorError or SupervisionError, or a ``_Silent`` when
    it did not finish ``within`` seconds of now."""
    deadline = time.monotonic() + within
    out: list[Any] = []
    for f in futures:
        try:
            out.append(f.get(timeout=max(0.1, deadline - time.monotonic())))
        except TimeoutError:
            out.append(_Silent())
        except (ActorError, SupervisionError) as e:
            out.append(e)
    return out


def _raise_for(
    procs: Any,
    backend: str,
    ranks: list[int],
    results: list[Any],
    silent_what: str,
    timeout: float,
    where: str,
) -> None:
    """A DistributedSetupError naming each rank that was silent or failed, if any."""
    silent = [r for r, res in zip(ranks, results) if isinstance(res, _Silent)]
    failed = [(r, res) for r, res in zip(ranks, results) if isinstance(res, BaseException)]
    if not silent and not failed:
        return
    lines = [f"torch.distributed ({backend}) did not come up on mesh {procs.name!r}{where}:"]
    if silent:
        lines.append(f"  rank(s) {silent} {silent_what} within {timeout:g} s")
    for r, e in failed:
        exc = getattr(e, "exception", None) or e
        text = str(exc).strip().splitlines()
        lines.append(f"  rank {r}: {type(exc).__name__}: {text[0] if text else ''}")
    lines.append(
        "Fix the named ranks (%mesh stacks, procs.respawn()), then call setup_torch_distributed() again."
    )
    raise DistributedSetupError("\n".join(lines))


__all__ = ["BACKENDS", "DIST_ACTOR", "DistributedSetupError", "TorchDistributed", "rejoin", "setup"]
