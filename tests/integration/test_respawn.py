"""A respawn while other threads call the mesh (real workers): a restarted rank is
dead until its actors are back, so a call made meanwhile fails as to a dead rank or
runs on the re-created actor, never with "no actor named"."""

from __future__ import annotations

import os
import signal
import threading
import time

from monarch_kernel import Actor, SupervisionError, endpoint

TIMEOUT = 60


class Slow(Actor):
    def __init__(self) -> None:
        time.sleep(1.0)  # a constructor that takes a while, as loading a model does

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_calls_during_a_respawn_see_a_dead_rank_or_the_new_actor(fresh_procs2):
    a = fresh_procs2.spawn("slow", Slow)
    one = a.slice(procs=1)
    old = one.pid.call_one().get(timeout=TIMEOUT)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + TIMEOUT
    while fresh_procs2.status()[1] != "dead" and time.monotonic() < deadline:
        time.sleep(0.05)
    seen: list[str] = []
    stop = threading.Event()

    def call() -> None:
        while not stop.is_set():
            try:
                seen.append(f"pid {one.pid.call_one().get(timeout=TIMEOUT)}")
            except SupervisionError:
                seen.append("dead")
            except Exception as e:
                seen.append(f"{type(e).__name__}: {e}")
            time.sleep(0.01)

    t = threading.Thread(target=call)
    t.start()
    try:
        assert fresh_procs2.respawn() == [1]
        time.sleep(0.3)
    finally:
        stop.set()
        t.join(TIMEOUT)
    new = one.pid.call_one().get(timeout=TIMEOUT)
    assert new != old
    unexpected = [s for s in seen if s not in ("dead", f"pid {new}")]
    assert not unexpected, unexpected[:5]
    assert seen[-1] == f"pid {new}"
