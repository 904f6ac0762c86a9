"""Notebook cells through jupyter_client: a trivial ``%%mesh`` cell on 4 ranks beside
a plain cell, in the same kernel and run (``make bench`` prints both).

A cell's round trip is from ``execute_request`` to its ``idle`` status on iopub, as a
front end sees it. Run alone: ``python bench/cells.py``."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any

N_CELLS = int(os.environ.get("BENCH_CELLS", "60"))


def _round_trip(kc: Any, code: str, timeout: float = 60.0) -> float:
    start = time.perf_counter()
    msg_id = kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            return time.perf_counter() - start


def _median(kc: Any, code: str, n: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        _round_trip(kc, code)
    return statistics.median(_round_trip(kc, code) for _ in range(n))


def cell_round_trips(n: int = N_CELLS) -> tuple[float, float]:
    """(median round trip of a plain cell, of a ``%%mesh`` cell on 4 ranks), seconds."""
    from jupyter_client.manager import start_new_kernel

    state = tempfile.mkdtemp(prefix="monarch-bench-cells-")
    env = {**os.environ, "XDG_STATE_HOME": state}
    km, kc = start_new_kernel(kernel_name="monarch", env=env)
    try:
        _round_trip(kc, "%mesh up bench-cells --procs 4", timeout=120)
        plain = _median(kc, "x = 1", n)
        mesh = _median(kc, "%%mesh\nx = 1", n)
        _round_trip(kc, "%mesh down bench-cells")
        return plain, mesh
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


if __name__ == "__main__":
    plain, mesh = cell_round_trips()
    print(f"plain cell {plain * 1e3:.2f} ms, %%mesh cell on 4 ranks {mesh * 1e3:.2f} ms", file=sys.stdout)
