"""INTERRUPT-2 on real workers: an interrupted wait cancels the remote call; a second
interrupt ends a worker whose call still runs (a thread in a blocking C call cannot be
stopped otherwise), and only that one."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
from proc_helpers import wait_for

from monarch_kernel import Actor, endpoint, this_host
from monarch_kernel.mesh._future import escalate_interrupted

TIMEOUT = 30


class Sleeper(Actor):
    @endpoint
    def block(self, seconds: float) -> str:
        time.sleep(seconds)  # one C call: KeyboardInterrupt waits for it to return
        return "woke"

    @endpoint
    def spin(self, seconds: float) -> str:
        end = time.time() + seconds
        while time.time() < end:  # Python code: stops at the first interrupt
            pass
        return "done"

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class AsyncSpinner(Actor):
    @endpoint
    async def spin(self, seconds: float) -> str:
        end = time.time() + seconds
        while time.time() < end:  # never awaits: the event loop is held
            pass
        return "done"

    @endpoint
    async def nap(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "rested"

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


def _interrupt_soon(delay: float = 0.5) -> threading.Timer:
    t = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    t.start()
    return t


@pytest.mark.slow
def test_a_second_interrupt_ends_only_the_worker_whose_call_still_runs(state_home):
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        s = procs.spawn("s", Sleeper)
        pids = list(s.pid.call().get(timeout=TIMEOUT).values())
        # rank 0 stops at the first interrupt; rank 1 sits in time.sleep(60)
        spin, block = s.slice(procs=0).spin.call_one(60), s.slice(procs=1).block.call_one(60)
        _interrupt_soon()
        with pytest.raises(KeyboardInterrupt):
            spin.get(timeout=TIMEOUT)
        _interrupt_soon()
        with pytest.raises(KeyboardInterrupt):
            block.get(timeout=TIMEOUT)
        time.sleep(1.5)
        assert procs.status() == ["alive", "alive"]  # the first interrupt never kills
        assert escalate_interrupted() == 1  # the second: only rank 1 still ran its call
        assert wait_for(lambda: procs.status() == ["alive", "dead"]), procs.status()
        assert any("interrupted twice" in line for line in procs.logs(rank=1, tail=5)), procs.logs(rank=1)
        assert s.slice(procs=0).pid.call_one().get(timeout=TIMEOUT) == pids[0]
        assert procs.respawn() == [1]
        assert s.slice(procs=1).spin.call_one(0).get(timeout=TIMEOUT) == "done"
        assert escalate_interrupted() == 0  # nothing left to escalate
    finally:
        procs.stop()


def test_an_interrupt_also_ends_calls_still_queued_behind_the_running_one(state_home):
    from monarch_kernel import ActorError
    from monarch_kernel.mesh._future import cancel_calls

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        s = procs.spawn("s", Sleeper)
        running = s.spin.call_one(20)
        queued = [s.spin.call_one(20) for _ in range(3)]  # one actor: they wait their turn
        time.sleep(0.5)
        t = time.monotonic()
        cancel_calls([c for f in [running, *queued] for c in f._calls])  # what the stop button does
        for f in [running, *queued]:
            with pytest.raises(ActorError, match="KeyboardInterrupt"):
                f.get(timeout=TIMEOUT)
        assert time.monotonic() - t < 10  # not 4 x 20 s
        assert s.spin.call_one(0).get(timeout=TIMEOUT) == "done"  # the actor goes on
        assert procs.status() == ["alive"]
    finally:
        procs.stop()


def test_an_interrupt_stops_an_async_endpoint_that_never_awaits(state_home):
    from monarch_kernel import ActorError
    from monarch_kernel.mesh._future import cancel_calls

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        a = procs.spawn("a", AsyncSpinner)
        pid = a.pid.call_one().get(timeout=TIMEOUT)
        running = a.spin.call_one(60)
        time.sleep(0.5)
        cancel_calls(running._calls)  # what the stop button does, once
        with pytest.raises(ActorError, match="CancelledError"):
            running.get(timeout=TIMEOUT)
        # The event loop is free again, in the same worker: async actors go on.
        assert a.nap.call_one(0.1).get(timeout=TIMEOUT) == "rested"
        assert a.spin.call_one(0).get(timeout=TIMEOUT) == "done"
        assert a.pid.call_one().get(timeout=TIMEOUT) == pid
        assert procs.status() == ["alive"]
    finally:
        procs.stop()


@pytest.mark.slow
def test_stops_of_two_different_calls_never_escalate_and_each_says_what_it_did_not_stop(state_home, capfd):
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        s = procs.spawn("s", Sleeper)
        first, second = s.slice(procs=0).block.call_one(60), s.slice(procs=1).block.call_one(60)
        _interrupt_soon()  # "cell 1": stop
        with pytest.raises(KeyboardInterrupt):
            first.get(timeout=TIMEOUT)
        _interrupt_soon()  # "cell 2": stop a different call
        with pytest.raises(KeyboardInterrupt):
            second.get(timeout=TIMEOUT)
        err = capfd.readouterr().err
        # Each stop said, in the cell, which call it could not stop and what to do.
        assert f"did not stop rank 0 of mesh {procs.name!r} (s.block)" in err, err
        assert f"did not stop rank 1 of mesh {procs.name!r} (s.block)" in err, err
        assert "Press stop again" in err
        time.sleep(1.5)  # past the escalation grace
        assert procs.status() == ["alive", "alive"]  # two stops of two calls kill nothing
        other = procs.spawn("o", Sleeper)
        assert len(other.pid.call().get(timeout=TIMEOUT).values()) == 2
    finally:
        procs.stop()


def test_each_call_in_flight_is_told_apart_by_its_key(state_home):
    # INTERRUPT-2 finds a call it interrupted before by its key (a fan-out's calls are
    # new objects each time they are read): every call in flight has its own, also
    # the calls of a stop, whose ids are all 0 (the StopActor RPC).
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        s = procs.spawn("s", Sleeper)
        spin = s.spin.call(0.5)
        stop = s.stop()
        keys = [c.key for c in spin._calls] + [c.key for c in stop._calls]
        assert len(set(keys)) == 4, keys
        assert [c.key for c in spin._calls] == [c.key for c in spin._calls]  # and keeps it
        stop.get(timeout=TIMEOUT)
    finally:
        procs.stop()
