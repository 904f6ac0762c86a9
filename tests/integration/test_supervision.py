"""Supervision (issue 3), with real workers: failure callbacks while idle,
``__supervise__``, respawn, hung (SIGSTOP) workers and a lost agent. (How each kind
of death reaches a pending call: ``test_worker_deaths.py``; worker output:
``test_worker_output.py``.)"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from mortal import Mortal, proc_rank, worker_of, workers_of
from proc_helpers import WITHIN, Failures, sigstop, still_alive, wait_for

from monarch_kernel import Actor, MeshFailure, SupervisionError, endpoint, this_host

TIMEOUT = 30


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self) -> int:
        self.value += 1
        return self.value

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Watcher(Actor):
    """Records the supervision events it is given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int | None]] = []

    def __supervise__(self, failure: MeshFailure) -> None:
        self.seen.append((failure.kind, failure.rank))

    @endpoint
    def events(self) -> list[tuple[str, int | None]]:
        return list(self.seen)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


# -- failures while the controller is idle --------------------------------------------


def test_on_failure_runs_for_a_worker_killed_while_no_call_is_pending(fresh_procs2):
    mesh = fresh_procs2.spawn("mortal", Mortal)
    assert mesh.ping.call().get(timeout=TIMEOUT).values() == [0, 1]
    got: list[MeshFailure] = []
    called = threading.Event()

    @fresh_procs2.on_failure
    def record(failure: MeshFailure) -> None:
        got.append(failure)
        called.set()

    pid = worker_of(fresh_procs2, 1)["pid"]
    os.kill(pid, signal.SIGKILL)
    assert called.wait(WITHIN), "on_failure was not called"
    failure = got[0]
    assert failure.kind == "dead"
    assert failure.rank == 1
    assert failure.pid == pid
    assert failure.signal == signal.SIGKILL
    assert failure.exit_code is None
    assert failure.mesh == fresh_procs2.name
    assert "rank 1" in str(failure)
    assert fresh_procs2.status() == ["alive", "dead"]
    assert fresh_procs2.degraded
    # A call that needs the dead rank fails before sending anything, saying how to
    # recover; the live rank answers.
    with pytest.raises(SupervisionError, match=r"respawn\(\)") as info:
        mesh.ping.call().get(timeout=TIMEOUT)
    assert info.value.rank == 1
    assert mesh.slice(procs=0).ping.call_one().get(timeout=TIMEOUT) == 0
    assert [f.kind for f in got] == ["dead"]  # reported once


def test_stopping_the_mesh_is_not_reported_to_on_failure(state_home):
    procs = this_host().spawn_procs(per_host={"procs": 2})
    failures = Failures()
    try:
        procs.on_failure(failures)
        assert procs.spawn("mortal", Mortal).ping.call().get(timeout=TIMEOUT).values() == [0, 1]
    finally:
        procs.stop()
    assert failures.wait_for("dead", within=1.0) is None, [str(f) for f in failures.got]
    assert failures.kinds() == []


def test_stopping_the_mesh_prints_no_failure_line(state_home, capfd):
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        assert procs.spawn("mortal", Mortal).ping.call().get(timeout=TIMEOUT).values() == [0, 1]
    finally:
        procs.stop()
    time.sleep(0.5)  # room for a late report (none should come)
    err = capfd.readouterr().err
    assert "monarch:" not in err, err


def test_a_host_seen_gone_after_the_stop_is_not_reported(state_home, capfd):
    """A heartbeat that began before stop() can find the hosts gone after it (a job
    killed just after its meshes stopped): a stopped mesh tells of no host lost or
    unreachable, and prints nothing."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    failures = Failures()
    procs.on_failure(failures)
    session = procs._session("test")
    (link,) = session.client.links
    procs.stop()
    session.supervisor.host_unreachable(link)
    session.supervisor.host_lost(link, ConnectionRefusedError("its agent refuses connections"))
    assert failures.kinds() == [], [str(f) for f in failures.got]
    assert session.state.lost is None and not session.lost_hosts
    assert "monarch:" not in capfd.readouterr().err


def test_exits_only_the_heartbeat_sees_are_asked_of_the_agents_once_a_round(state_home):
    """SUPERVISE-1 when the watch stream missed the exits: a heartbeat whose pings find
    ranks not running asks their agents once for all of them, and each is reported
    dead once (before: once per rank, and once more per death, at every agent: a stop
    of 64 x 16 procs that met a heartbeat made 65,536 requests, and printed a
    traceback if the interpreter was exiting meanwhile)."""
    procs = this_host().spawn_procs(per_host={"procs": 4})
    try:
        failures = Failures()
        procs.on_failure(failures)
        assert procs.spawn("mortal", Mortal).ping.call().get(timeout=TIMEOUT).values() == [0, 1, 2, 3]
        pids = [worker_of(procs, r)["pid"] for r in (1, 2, 3)]
        session = procs._session("test")
        # The watch stream drops its exit events (as it does for a reader that lags):
        # only the heartbeat can see them go now.
        session._cancel_watch()
        (link,) = session.client.links
        session._cancels[0] = session.client.watch_link(
            link, lambda ev: None if ev.HasField("worker_exited") else session._on_event(ev), session._on_end
        )
        looks: list[str] = []
        real = session.client.list_workers_raw

        def counted(*args: Any, **kwargs: Any) -> Any:
            looks.append(threading.current_thread().name)
            return real(*args, **kwargs)

        session.client.list_workers_raw = counted  # type: ignore[method-assign]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        assert failures.wait(lambda got: len([f for f in got if f.kind == "dead"]) >= 3), failures.kinds()
        time.sleep(1.5)  # a heartbeat more: no death is told twice
        assert sorted(f.rank for f in failures.got if f.kind == "dead") == [1, 2, 3]
        beats = [name for name in looks if name.startswith("monarch-heartbeat")]
        # (the kills may fall on both sides of a heartbeat's pings: two rounds)
        assert 1 <= len(beats) <= 2, looks
    finally:
        procs.stop()


def _unpickled_in(path: str) -> str:
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    return path


class Tripwire:
    """Notes the pid of every process that unpickles it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpickled_in, (self.path,)


class Armed(Actor):
    def __init__(self, wire: str) -> None:
        self.wire = wire

    @endpoint
    def ping(self) -> int:
        return proc_rank()


def test_supervise_hook_of_surviving_actors_hears_of_a_dead_rank(fresh_procs2, tmp_path):
    # A failure does not unpickle the constructor arguments of actor meshes in the
    # controller (they may be large, or do things when unpickled).
    wire = tmp_path / "unpickled-by"
    fresh_procs2.spawn("armed", Armed, Tripwire(str(wire)))
    mesh = fresh_procs2.spawn("watcher", Watcher)
    rank0 = mesh.slice(procs=0)
    assert rank0.events.call_one().get(timeout=TIMEOUT) == []
    pid = worker_of(fresh_procs2, 1)["pid"]
    os.kill(pid, signal.SIGKILL)
    seen = wait_for(lambda: rank0.events.call_one().get(timeout=TIMEOUT), every=0.1)
    assert seen == [("dead", 1)]
    assert str(os.getpid()) not in wire.read_text().split(), "the controller unpickled them"


def _switches(tid: int) -> int:
    """How many times thread ``tid`` of this process was switched out (it slept or was preempted)."""
    fields = dict(
        line.split(":", 1)
        for line in open(f"/proc/self/task/{tid}/status").read().splitlines()
        if ":" in line
    )
    return int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])


def test_an_idle_controller_starts_no_thread_and_its_watch_threads_sleep(fresh_procs2, monkeypatch):
    """WATCH-1: between events, supervision wakes no Python thread but its heartbeat's:
    the Watch streams and the heartbeat's pings are the native runtime's (grpcio woke
    each watch thread ten times a second and started a polling thread per heartbeat)."""
    mesh = fresh_procs2.spawn("counter", Counter, 0)
    assert mesh.incr.call().get(timeout=TIMEOUT).values() == [1, 1]
    session = fresh_procs2._session("the test")
    names = {f"monarch-watch-{link.client.addr}" for link in session.client.links}
    threads = {t.name: t for t in threading.enumerate()}
    watchers = [threads[name] for name in names]
    beat = threads[f"monarch-heartbeat-{fresh_procs2.name}"]
    started: list[str] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    before = {t.native_id: _switches(t.native_id) for t in [*watchers, beat]}
    time.sleep(3.0)
    after = {tid: _switches(tid) for tid in before}
    assert after[beat.native_id] - before[beat.native_id] >= 2  # the heartbeat ran meanwhile
    assert started == []
    assert {t.name: after[t.native_id] - before[t.native_id] for t in watchers} == {
        t.name: 0 for t in watchers
    }


# -- respawn -------------------------------------------------------------------------


def test_respawn_restarts_a_dead_rank_with_its_actors_from_their_constructor(fresh_procs2):
    counter = fresh_procs2.spawn("counter", Counter, 10)
    for _ in range(3):
        counter.incr.call().get(timeout=TIMEOUT)
    assert counter.incr.call().get(timeout=TIMEOUT).values() == [14, 14]
    old_pid = counter.slice(procs=1).pid.call_one().get(timeout=TIMEOUT)
    os.kill(old_pid, signal.SIGKILL)
    assert wait_for(lambda: fresh_procs2.status() == ["alive", "dead"]), fresh_procs2.status()

    assert fresh_procs2.respawn() == [1]

    assert fresh_procs2.status() == ["alive", "alive"]
    assert not fresh_procs2.degraded
    assert counter.slice(procs=1).incr.call_one().get(timeout=TIMEOUT) == 11  # afresh
    assert counter.slice(procs=0).incr.call_one().get(timeout=TIMEOUT) == 15  # untouched
    assert counter.incr.call().get(timeout=TIMEOUT).values() == [16, 12]
    new_pid = counter.slice(procs=1).pid.call_one().get(timeout=TIMEOUT)
    assert new_pid != old_pid
    assert worker_of(fresh_procs2, 1)["pid"] == new_pid
    assert worker_of(fresh_procs2, 1)["state"] == "running"
    assert still_alive([old_pid]) == []
    assert fresh_procs2.respawn() == []  # nothing left to restart


# -- unresponsive workers ------------------------------------------------------------


@pytest.mark.slow
def test_a_stopped_worker_is_unresponsive_then_recovers_on_sigcont(fresh_procs2):
    mesh = fresh_procs2.spawn("mortal", Mortal)
    failures = Failures()
    fresh_procs2.on_failure(failures)
    pid = worker_of(fresh_procs2, 1)["pid"]
    assert mesh.slice(procs=1).pid.call_one().get(timeout=TIMEOUT) == pid
    sigstop(pid)
    try:
        assert wait_for(lambda: fresh_procs2.status()[1] == "unresponsive"), fresh_procs2.status()
        assert fresh_procs2.status() == ["alive", "unresponsive"]
        assert fresh_procs2.degraded
        hung = failures.wait_for("unresponsive")
        assert hung is not None, failures.kinds()
        assert hung.rank == 1
        assert hung.pid == pid
        assert "SIGSTOP" in str(hung)
        assert worker_of(fresh_procs2, 1)["proc_state"] == "T"
        assert worker_of(fresh_procs2, 1)["state"] == "running"
        assert "dead" not in failures.kinds()
        assert mesh.slice(procs=0).ping.call_one().get(timeout=TIMEOUT) == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_for(lambda: fresh_procs2.status() == ["alive", "alive"]), fresh_procs2.status()
    back = failures.wait_for("recovered")
    assert back is not None, failures.kinds()
    assert back.rank == 1
    assert mesh.slice(procs=1).pid.call_one().get(timeout=TIMEOUT) == pid
    assert failures.kinds() == ["unresponsive", "recovered"]


# -- a lost agent --------------------------------------------------------------------


def test_a_killed_agent_loses_the_mesh_its_workers_and_later_calls(fresh_procs2):
    mesh = fresh_procs2.spawn("mortal", Mortal)
    failures = Failures()
    fresh_procs2.on_failure(failures)
    workers = [w["pid"] for w in workers_of(fresh_procs2)]
    agent = fresh_procs2._session("test").agent.popen
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait(TIMEOUT)
    assert still_alive(workers) == []
    lost = failures.wait_for("lost")
    assert lost is not None, failures.kinds()
    assert lost.mesh == fresh_procs2.name
    assert "lost" in str(lost)
    assert fresh_procs2.status() == ["lost", "lost"]
    with pytest.raises(SupervisionError, match="is lost") as info:
        mesh.ping.call().get(timeout=TIMEOUT)
    assert fresh_procs2.name in str(info.value)
    with pytest.raises(SupervisionError, match="is lost"):
        mesh.slice(procs=0).ping.call_one().get(timeout=TIMEOUT)
    fresh_procs2.stop()  # must not raise
    assert fresh_procs2.status() == ["stopped", "stopped"]
