"""``Mortal``, the actor whose worker a supervision test can make die in several
ways, and the agent's record of a test mesh's workers (shared by
``test_worker_deaths.py`` and ``test_supervision.py``)."""

from __future__ import annotations

import ctypes
import os
import resource
import time
from pathlib import Path

from monarch_kernel import Actor, endpoint


def proc_rank() -> int:
    """This worker's proc rank (``current_rank()`` is the rank within the called slice)."""
    return int(os.environ["MONARCH_RANK"])


class Mortal(Actor):
    """An actor whose worker can be made to die in several ways."""

    @endpoint
    def ping(self) -> int:
        return proc_rank()

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def sleep(self, seconds: float) -> str:
        print(f"rank {proc_rank()} goes to sleep", flush=True)
        time.sleep(seconds)
        return "woke"

    @endpoint
    def exit_with(self, code: int) -> None:
        print(f"rank {proc_rank()} exits with code {code}", flush=True)
        os._exit(code)

    @endpoint
    def segfault(self) -> None:
        print(f"rank {proc_rank()} reads address 0", flush=True)
        ctypes.string_at(0)

    @endpoint
    def limit_memory(self, headroom: int) -> int:
        """Caps the address space at the current size plus ``headroom`` bytes."""
        status = Path("/proc/self/status").read_text()
        vm_size = next(
            int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmSize:")
        )
        limit = vm_size + headroom
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        print(f"rank {proc_rank()} limits its memory to {limit} bytes", flush=True)
        return limit

    @endpoint
    def size_of(self, data: bytes) -> int:
        return len(data)

    @endpoint
    def hog(self, nbytes: int) -> int:
        print(f"rank {proc_rank()} takes {nbytes} bytes", flush=True)
        block = bytearray(nbytes)
        block[::4096] = b"x" * len(range(0, nbytes, 4096))  # every page, for real
        return len(block)


def workers_of(procs) -> list[dict]:
    """The agent's records of ``procs``' workers."""
    return procs._session("test").client.list_workers()


def worker_of(procs, rank: int) -> dict:
    """The agent's record of ``procs``' worker of ``rank``."""
    return next(w for w in workers_of(procs) if w["rank"] == rank)
