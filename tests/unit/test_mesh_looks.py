"""REGISTRY-4: the meshes in the state files are looked at concurrently, and a kernel's
start waits for them a bounded time (a look at a mesh whose agents do not answer, or
whose allocator is slow to say its job ended, takes seconds: one after another, the
state files a test session had left made a kernel start outlast the console's wait).
The looks here are stand-ins for ``mesh_info`` that wait on events, so what is shown
is the order of events, not a duration."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from monarch_kernel.hosts import _admin


class _Looks:
    """``mesh_info`` for names that each wait until released (or until ``parties``
    looks run at once, with ``together``)."""

    def __init__(self, together: int = 0) -> None:
        self.released = threading.Event()
        self.barrier = threading.Barrier(together, timeout=30) if together else None
        self.started: list[str] = []

    def __call__(self, name: str, usage_wait: Any = None, usage_beyond: int = 0) -> Any:
        self.started.append(name)
        if self.barrier is not None:
            self.barrier.wait()  # BrokenBarrierError unless that many run at once
        else:
            assert self.released.wait(30)
        if name.startswith("gone"):
            return None
        if name.startswith("bad"):
            raise RuntimeError(f"cannot look at {name}")
        return name


def test_meshes_are_looked_at_at_once_and_listed_in_the_order_of_their_names(monkeypatch):
    looks = _Looks(together=4)
    monkeypatch.setattr(_admin, "mesh_info", looks)
    names = ["a", "gone-b", "c", "d"]
    found, unchecked = _admin.look_at(names)
    assert (found, unchecked) == (["a", "c", "d"], [])


def test_a_bounded_look_names_the_meshes_not_seen_in_time_and_they_finish_later(monkeypatch):
    looks = _Looks()
    monkeypatch.setattr(_admin, "mesh_info", looks)
    names = [f"m{i}" for i in range(_admin.LOOKS_AT_ONCE + 3)]
    found, unchecked = _admin.look_at(names, within=0.2)
    assert (found, unchecked) == ([], names)
    # At most LOOKS_AT_ONCE looks run at a time; the rest wait for a free one.
    deadline = time.monotonic() + 30
    while len(looks.started) < _admin.LOOKS_AT_ONCE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(looks.started) == sorted(names[: _admin.LOOKS_AT_ONCE])
    looks.released.set()
    assert _admin.look_at(["m0", "m1"], within=30) == (["m0", "m1"], [])


def test_a_look_that_fails_fails_the_listing_once_all_are_done(monkeypatch):
    looks = _Looks()
    looks.released.set()
    monkeypatch.setattr(_admin, "mesh_info", looks)
    with pytest.raises(RuntimeError, match="cannot look at bad-x"):
        _admin.look_at(["a", "bad-x", "c"])
    assert sorted(looks.started) == ["a", "bad-x", "c"]
