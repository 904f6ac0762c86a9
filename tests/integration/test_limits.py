"""What a mesh leaves on disk and what the transfer engine lets a peer hold, with
real agents and sockets: logs readable by their owner only and removed once stale;
unauthenticated connections capped and short-lived."""

from __future__ import annotations

import os
import socket
import stat
import time
import uuid

import numpy as np
import pytest

from monarch_kernel import Actor, _native, endpoint, this_host
from monarch_kernel.hosts import state_dir
from monarch_kernel.hosts._local import KEEP_LOGS_S


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


class _Noop(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"


def test_worker_and_agent_logs_are_private_and_stale_ones_are_removed(state_home):
    logs = state_dir() / "logs"
    old, recent = logs / "old-mesh", logs / "recent-mesh"
    for d in (old, recent):
        d.mkdir(parents=True, exist_ok=True)
        (d / "rank-0.log").write_text("from a mesh that stopped\n")
    past = time.time() - KEEP_LOGS_S - 3600
    for p in (old / "rank-0.log", old):
        os.utime(p, (past, past))
    name = f"logs-{uuid.uuid4().hex[:6]}"
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=name)
    try:
        procs.spawn("noop", _Noop).ping.call_one().get(timeout=30)
        mine = logs / name
        assert _mode(logs) == 0o700 and _mode(mine) == 0o700
        files = sorted(p.name for p in mine.iterdir())
        assert "agent.log" in files and "rank-0.log" in files, files
        for p in mine.iterdir():
            assert _mode(p) == 0o600, (p, oct(_mode(p)))
        assert not old.exists()  # stopped more than KEEP_LOGS_S ago
        assert recent.exists()  # a recent run's logs stay (for a look after a crash)
    finally:
        procs.stop()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_idle_unauthenticated_connections_are_capped_and_do_not_pile_up_threads():
    keep = np.arange(1 << 16, dtype=np.uint8)
    desc = _native.xfer_register(keep, "token-of-this-test", 0, None)  # the engine listens now
    host, port = _native.xfer_stats()["addr"].rsplit(":", 1)
    before = _threads()
    socks = []
    try:
        for _ in range(300):  # never say hello
            socks.append(socket.create_connection((host, int(port)), timeout=5))
        time.sleep(1.0)
        stats = _native.xfer_stats()
        assert stats["open_connections"] <= 256
        assert stats["refused_connections"] >= 300 - 256
        assert _threads() - before <= 256 + 8
    finally:
        for s in socks:
            s.close()
        _native.xfer_drop(desc.id)
    # Closed or timed out (the handshake window), the connections end with their threads.
    deadline = time.monotonic() + 15
    while _native.xfer_stats()["open_connections"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _native.xfer_stats()["open_connections"] == 0


def test_a_mesh_larger_than_the_host_can_hold_is_refused_before_anything_starts(state_home, monkeypatch):
    from monarch_kernel import list_meshes
    from monarch_kernel.errors import MeshSpecError

    name = f"huge-{uuid.uuid4().hex[:6]}"
    monkeypatch.delenv("MONARCH_MAX_PROCS", raising=False)
    with pytest.raises(MeshSpecError) as info:
        this_host().spawn_procs(per_host={"procs": 1_000_000}, name=name)
    assert "more than this host can hold" in str(info.value)
    assert "MONARCH_MAX_PROCS" in str(info.value)  # the override, named
    assert name not in [m.name for m in list_meshes()]
    assert not (state_dir() / "logs" / name).exists()  # no agent was started
    monkeypatch.setenv("MONARCH_MAX_PROCS", "2")
    with pytest.raises(MeshSpecError, match="MONARCH_MAX_PROCS=2"):
        this_host().spawn_procs(per_host={"procs": 3})
