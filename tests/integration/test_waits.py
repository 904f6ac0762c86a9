"""A wait says what it waits behind (real workers): a rank busy with another call
(which, and where its code is), or a rank that does not answer."""

from __future__ import annotations

import math
import os
import signal
import time

import pytest
from proc_helpers import sigstop

from monarch_kernel import Actor, controller, endpoint

TIMEOUT = 30


class Busy(Actor):
    @endpoint
    def block(self, seconds: float) -> str:
        time.sleep(seconds)
        return "woke"

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def hold_interpreter(self, seconds: float) -> str:
        """Holds the GIL (as an import or a native call does) for about ``seconds``: a
        regular expression that backtracks, sized from a short run of it."""
        import re

        pattern = re.compile(r"(a+)+b")
        n, took = 16, 0.0
        while took < 0.05:
            n += 1
            t = time.monotonic()
            pattern.match("a" * n)
            took = time.monotonic() - t
        n += max(0, int(math.log2(seconds / took)))  # each "a" doubles the time
        pattern.match("a" * n)
        return "done"


@pytest.mark.slow
def test_a_call_queued_behind_another_says_which_and_where_its_code_is(fresh_procs1):
    b = fresh_procs1.spawn("b", Busy)
    pid = b.pid.call_one().get(timeout=TIMEOUT)
    first = b.block.call_one(5)
    time.sleep(0.5)
    queued = b.pid.call_one()
    (line,) = controller.describe_wait(controller.calls_of([queued]))
    assert f"rank 0 of mesh {fresh_procs1.name!r} is busy with b.block" in line
    assert "block (" in line and "test_waits.py" in line  # the frame: the endpoint's own code
    assert "stop" in line and "%mesh stacks" in line
    assert first.get(timeout=TIMEOUT) == "woke" and queued.get(timeout=TIMEOUT) == pid
    assert controller.describe_wait(controller.calls_of([queued])) == []  # nothing pending


def test_a_rank_that_does_not_answer_is_named(fresh_procs1):
    b = fresh_procs1.spawn("b", Busy)
    pid = b.pid.call_one().get(timeout=TIMEOUT)
    sigstop(pid)
    try:
        waiting = b.pid.call_one()
        (line,) = controller.describe_wait(controller.calls_of([waiting]))
        assert f"rank 0 of mesh {fresh_procs1.name!r} does not answer" in line
    finally:
        os.kill(pid, signal.SIGCONT)
    assert waiting.get(timeout=TIMEOUT) == pid


def test_a_rank_that_holds_its_interpreter_is_busy_and_not_said_to_hang(fresh_procs1):
    b = fresh_procs1.spawn("b", Busy)
    b.pid.call_one().get(timeout=TIMEOUT)
    first = b.hold_interpreter.call_one(4.0)
    time.sleep(1.0)
    queued = b.pid.call_one()
    lines = controller.describe_wait(controller.calls_of([queued]))
    assert not [line for line in lines if "does not answer" in line], lines
    assert first.get(timeout=120) == "done"
    queued.get(timeout=TIMEOUT)
    assert fresh_procs1.status() == ["alive"]
