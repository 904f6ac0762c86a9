"""FAST-1: a sync actor's plain calls are run by the worker's native server on the
actor's thread, without the Python dispatcher, and mean what they meant: the same
context, origin, results, exceptions, refusals and cancels (real workers)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from monarch_kernel import Actor, context, current_rank, endpoint

TIMEOUT = 30


class Probe(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def frames(self) -> list[str]:
        """The names of the Python functions below this endpoint on its thread."""
        return [f.function for f in inspect.stack()[1:]]

    @endpoint
    def bump(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def where(self) -> tuple[int, str]:
        return current_rank().rank, str(context().message_rank)

    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    @endpoint
    def fail(self, text: str) -> None:
        raise ValueError(text)

    @endpoint
    def end(self) -> None:
        raise SystemExit("ended by its endpoint")


def test_a_plain_call_after_the_first_runs_without_the_python_dispatcher(fresh_procs1: Any) -> None:
    p = fresh_procs1.spawn("probe", Probe)
    first = p.frames.call_one().get(timeout=TIMEOUT)
    later = p.frames.call_one().get(timeout=TIMEOUT)
    assert "run_sync_item" in first, first  # the first call sets the actor's context
    assert "run_sync_item" not in later, later  # (MONARCH_PLAIN_CALLS=0 keeps it)
    assert later[0] == "_call", later  # the frame a traceback's first line drops


def test_plain_calls_keep_their_context_results_and_exceptions(fresh_procs2: Any) -> None:
    p = fresh_procs2.spawn("probe", Probe)
    for _ in range(3):  # the first call of each place takes the dispatcher, the rest not
        assert p.where.call().get(timeout=TIMEOUT).item(procs=1) == (1, "{'procs': 1/2}")
    one = p.slice(procs=1)  # (another place: a mesh of one, without the dimension)
    for _ in range(3):
        assert one.where.call_one().get(timeout=TIMEOUT) == (0, "{}")
    assert [p.bump.call().get(timeout=TIMEOUT).item(procs=0) for _ in range(3)] == [1, 2, 3]
    with pytest.raises(Exception) as raised:
        one.fail.call_one("no such thing").get(timeout=TIMEOUT)
    text = str(raised.value)
    assert "no such thing" in text and "raise ValueError(text)" in text, text
    assert "in _call" not in text, text  # the remote traceback starts at the endpoint
    assert one.bump.call_one().get(timeout=TIMEOUT) == 4  # an exception leaves it usable


def test_plain_calls_scalar_results_come_back_as_they_were(fresh_procs1: Any) -> None:
    """A scalar result is pickled by the native server (the commonest without a
    pickler): each comes back equal and of its type, at the edges of the short forms."""
    p = fresh_procs1.spawn("probe", Probe)
    values = [None, True, False, 0, 1, 255, 256, -1, 65535, 65536, 2**31, -(2**31) - 1, 2**70, 0.5, -0.0]
    for v in values * 2:  # (the first call of each takes the dispatcher)
        got = p.echo.call_one(v).get(timeout=TIMEOUT)
        assert (got, type(got)) == (v, type(v)), (v, got)
    assert str(p.echo.call_one(-0.0).get(timeout=TIMEOUT)) == "-0.0"


def test_an_actor_that_fails_in_a_plain_call_refuses_the_next(fresh_procs1: Any) -> None:
    p = fresh_procs1.spawn("probe", Probe)
    assert p.bump.call_one().get(timeout=TIMEOUT) == 1
    assert p.bump.call_one().get(timeout=TIMEOUT) == 2
    with pytest.raises(Exception) as raised:
        p.end.call_one().get(timeout=TIMEOUT)
    assert "ended by its endpoint" in str(raised.value)
    with pytest.raises(Exception) as refused:
        p.bump.call_one().get(timeout=TIMEOUT)
    assert "ended by its endpoint" in str(refused.value), refused.value


def test_the_knob_keeps_every_call_on_the_dispatcher(tmp_path: Any) -> None:
    """``MONARCH_PLAIN_CALLS=0`` (the workers inherit it): no call is run natively."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_plain_calls import Probe
        from monarch_kernel import this_host
        procs = this_host().spawn_procs(per_host={{"procs": 1}})
        try:
            p = procs.spawn("probe", Probe)
            p.frames.call_one().get(timeout=30)
            print("run_sync_item" in p.frames.call_one().get(timeout=30))
        finally:
            procs.stop()
        """
    )
    env = {**os.environ, "MONARCH_PLAIN_CALLS": "0", "XDG_STATE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip().splitlines()[-1:] == ["True"], done.stdout + done.stderr


def test_a_stopped_actors_queued_plain_calls_are_refused(fresh_procs1: Any) -> None:
    p = fresh_procs1.spawn("probe", Probe)
    assert p.bump.call_one().get(timeout=TIMEOUT) == 1
    assert p.bump.call_one().get(timeout=TIMEOUT) == 2
    p.stop().get(timeout=TIMEOUT)
    with pytest.raises(Exception) as refused:
        p.bump.call_one().get(timeout=TIMEOUT)
    assert "probe" in str(refused.value), refused.value


class Turns(Actor):
    """Counts the turns of its thread's lane loop (``LaneThread._run``), each of which
    asks the thread's job queue whether it is empty."""

    def __init__(self) -> None:
        self.flag = threading.Event()

    def _runner(self) -> Any:
        from monarch_kernel.worker._lanes import lane_threads

        return next(r for r in list(lane_threads) if r.thread is threading.current_thread())

    @endpoint
    def watch(self) -> None:
        runner = self._runner()

        class Counting:
            def __init__(self, jobs: Any) -> None:
                self.jobs, self.turns = jobs, 0

            def empty(self) -> bool:
                self.turns += 1
                return bool(self.jobs.empty())

            def get_nowait(self) -> Any:
                return self.jobs.get_nowait()

            def put(self, job: Any) -> None:
                self.jobs.put(job)

        runner.jobs = Counting(runner.jobs)

    @endpoint
    def turns(self) -> int:
        return int(self._runner().jobs.turns)

    @endpoint
    def bump(self) -> int:
        return 1

    @endpoint
    def submit_later(self) -> None:
        """A job for this thread, submitted from another thread while calls arrive."""
        runner = self._runner()
        threading.Timer(0.2, lambda: runner.submit(self.flag.set)).start()

    @endpoint
    def flagged(self) -> bool:
        return self.flag.is_set()

    @endpoint
    def seen_by_a_job(self) -> None:
        """A job for this thread that keeps the actor context and origin it sees."""
        from monarch_kernel import _origin
        from monarch_kernel.actor import _ROOT, _current

        runner = self._runner()
        runner.submit(lambda: setattr(self, "_seen", (_current.get() is _ROOT, _origin.var.get())))

    @endpoint
    def seen(self) -> Any:
        return getattr(self, "_seen", None)


def test_plain_calls_in_a_row_run_no_line_of_the_lane_loop(fresh_procs1: Any) -> None:
    """LANE-2: the native server goes on serving an actor's plain calls until its lane
    is woken for a job; the Python loop between them turns only then."""
    p = fresh_procs1.spawn("turns", Turns)
    for _ in range(2):  # (the first call of the actor takes the dispatcher)
        p.watch.call_one().get(timeout=TIMEOUT)
    for _ in range(50):
        assert p.bump.call_one().get(timeout=TIMEOUT) == 1
    turns = p.turns.call_one().get(timeout=TIMEOUT)
    assert turns < 10, f"the lane loop turned {turns} times for 50 plain calls"


def test_a_job_after_plain_calls_runs_outside_their_context(fresh_procs1: Any) -> None:
    """LANE-2: plain calls in a row keep the actor's context and origin set between
    them; what else runs on the thread (a job) sees neither."""
    p = fresh_procs1.spawn("turns", Turns)
    for _ in range(5):
        assert p.bump.call_one().get(timeout=TIMEOUT) == 1
    p.seen_by_a_job.call_one().get(timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while (seen := p.seen.call_one().get(timeout=TIMEOUT)) is None:
        assert time.monotonic() < deadline, "the job never ran"
    assert seen == (True, ""), f"the job saw (the root context, the origin) = {seen}"


def test_a_job_submitted_while_plain_calls_arrive_still_runs(fresh_procs1: Any) -> None:
    """LANE-2: a job submitted to an actor's thread while it serves plain calls runs
    between two of them (its wake makes the native server return)."""
    p = fresh_procs1.spawn("turns", Turns)
    p.submit_later.call_one().get(timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while not p.flagged.call_one().get(timeout=TIMEOUT):
        assert time.monotonic() < deadline, "the job never ran"
