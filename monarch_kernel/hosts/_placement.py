"""GPU placement: ``spawn_procs(per_host={"gpus": N})`` starts one proc per GPU.

The controller picks the GPUs (PLACE-1): the entries of its own
``CUDA_VISIBLE_DEVICES`` if set, else every NVIDIA GPU the driver lists, and hands
the first N to the workers as ``MONARCH_GPUS``; a worker, before any user code runs,
sets ``CUDA_VISIBLE_DEVICES`` to its own entry (so it sees one GPU, ``cuda:0``) and
``LOCAL_RANK`` to its rank on the host. Fewer GPUs than procs is an error; a host
with none runs the procs on the CPU, with one warning, so the same code runs on a
laptop and on a GPU node. On another host (a mesh with a ``hosts`` dimension), each
worker picks its entry from what its own host lists, the same way.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping

from monarch_kernel._caller import user_stacklevel
from monarch_kernel.errors import MeshSpecError

#: The per_host dimension that asks for one GPU per proc.
GPU_DIM = "gpus"
#: Where a worker finds the GPUs of its host's procs, in local-rank order.
GPUS_ENV = "MONARCH_GPUS"
#: The dimension of a mesh across hosts that numbers its hosts (hosts are not placed:
#: the GPUs of a proc on another host are picked there, by its worker).
HOSTS_DIM = "hosts"


class GpuPlacementWarning(UserWarning):
    """``gpus`` procs on a host without NVIDIA GPUs: they run on the CPU."""


def _driver_gpus() -> int:
    """How many NVIDIA GPUs the driver lists (0 without a driver); CUDA is not
    initialised in the controller for this."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        pass
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0


def host_gpus(driver_count: int | None = None, visible: str | None = None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries this process may hand out, in order."""
    count = _driver_gpus() if driver_count is None else driver_count
    if count == 0:
        return []
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(count)]
    out = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry or entry.startswith("-"):
            break  # CUDA ignores everything from the first invalid entry on
        out.append(entry)
    return out


def placement_env(sizes: Mapping[str, int], gpus: list[str] | None = None) -> dict[str, str]:
    """The workers' environment for ``sizes`` (empty unless it has a ``gpus`` dim)."""
    if GPU_DIM not in sizes:
        return {}
    need = math.prod(sizes.values())
    if gpus is None:
        gpus = host_gpus()
    if not gpus:
        warnings.warn(
            f"per_host={dict(sizes)} asks for {need} GPU procs, but this host has no NVIDIA GPU: "
            "they run on the CPU (torch.cuda.is_available() is False there; torch.distributed uses gloo)",
            GpuPlacementWarning,
            stacklevel=user_stacklevel(),
        )
        return {GPUS_ENV: ""}
    if len(gpus) < need:
        where = (
            f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}"
            if "CUDA_VISIBLE_DEVICES" in os.environ
            else "the NVIDIA driver"
        )
        raise MeshSpecError(
            f"per_host={dict(sizes)} asks for {need} GPUs (one per proc), but this host has {len(gpus)} "
            f"({where}): ask for at most {len(gpus)}, or use {{'procs': N}} for procs without a GPU each"
        )
    return {GPUS_ENV: ",".join(gpus[:need])}


def apply_in_worker(rank: int, dims: list[str], sizes: list[int]) -> None:
    """At a worker's start, before user code: ``LOCAL_RANK``, and the one GPU it sees.
    A mesh without a ``gpus`` dimension keeps the GPUs it inherited (a mesh spawned
    from a GPU proc shares that proc's GPU), whatever ``MONARCH_GPUS`` it inherited."""
    per_host = math.prod(n for d, n in zip(dims, sizes) if d != HOSTS_DIM) or 1
    local = rank % per_host
    os.environ["LOCAL_RANK"] = str(local)
    if GPU_DIM not in dims:
        os.environ.pop(GPUS_ENV, None)
        return
    gpus = os.environ.get(GPUS_ENV)
    if gpus is None and HOSTS_DIM in dims:  # on another host: the GPUs it was given there
        gpus = ",".join(host_gpus())
    if gpus is not None:
        entries = gpus.split(",") if gpus else []
        os.environ["CUDA_VISIBLE_DEVICES"] = entries[local] if local < len(entries) else ""


__all__ = [
    "GPU_DIM",
    "GPUS_ENV",
    "HOSTS_DIM",
    "GpuPlacementWarning",
    "apply_in_worker",
    "host_gpus",
    "placement_env",
]
