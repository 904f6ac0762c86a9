"""Supervision (issue 3), with real workers: how each kind of worker death reaches a
pending call, failure callbacks while idle, ``__supervise__``, respawn, hung
(SIGSTOP) workers, a lost agent, and worker output (logs, streams, forwarding)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from proc_helpers import WITHIN, Failures, sigstop, still_alive, wait_for

from monarch_kernel import (
    Actor,
    MeshFailure,
    MeshStoppedError,
    SupervisionError,
    endpoint,
    this_host,
)

TIMEOUT = 30
MIB = 1024 * 1024


def _rank() -> int:
    """This worker's proc rank (``current_rank()`` is the rank within the called slice)."""
    return int(os.environ["MONARCH_RANK"])


class Mortal(Actor):
    """An actor whose worker can be made to die in several ways."""

    @endpoint
    def ping(self) -> int:
        return _rank()

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def sleep(self, seconds: float) -> str:
        print(f"rank {_rank()} goes to sleep", flush=True)
        time.sleep(seconds)
        return "woke"

    @endpoint
    def exit_with(self, code: int) -> None:
        print(f"rank {_rank()} exits with code {code}", flush=True)
        os._exit(code)

    @endpoint
    def segfault(self) -> None:
        print(f"rank {_rank()} reads address 0", flush=True)
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
        print(f"rank {_rank()} limits its memory to {limit} bytes", flush=True)
        return limit

    @endpoint
    def size_of(self, data: bytes) -> int:
        return len(data)

    @endpoint
    def hog(self, nbytes: int) -> int:
        print(f"rank {_rank()} takes {nbytes} bytes", flush=True)
        block = bytearray(nbytes)
        block[::4096] = b"x" * len(range(0, nbytes, 4096))  # every page, for real
        return len(block)


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


class Speaker(Actor):
    @endpoint
    def say(self, text: str) -> None:
        print(f"{text} from rank {_rank()}", flush=True)

    @endpoint
    def flood(self, lines: int) -> None:
        pad = "." * 200  # long lines: the transport's buffers hold fewer of them
        for i in range(lines):
            print(pad, "flood", i)
        sys.stdout.flush()


# -- helpers -------------------------------------------------------------------------


def _workers(procs) -> list[dict]:
    return procs._session("test").client.list_workers()


def _worker(procs, rank: int) -> dict:
    return next(w for w in _workers(procs) if w["rank"] == rank)


def _wait_for_line(procs, rank: int, text: str) -> None:
    """Until ``rank``'s log has a line with ``text``."""
    deadline = time.monotonic() + TIMEOUT
    while not any(text in line for line in procs.logs(rank=rank, tail=20)):
        assert time.monotonic() < deadline, f"rank {rank} never printed {text!r}"
        time.sleep(0.05)


@pytest.fixture
def own_procs2(state_home):
    """Two procs that a test may break."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    yield procs
    procs.stop()


@pytest.fixture
def quiet_procs2(state_home):
    """Two procs that a test may break. Their native aborts print no Rust backtrace
    by default, whatever RUST_BACKTRACE is here, so a worker's last lines are its
    message (the memory-limit case checks that)."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    yield procs
    procs.stop()


# -- each kind of worker death fails a pending call ----------------------------------


def _die_by_kill(procs, mesh, pid: int):
    pending = mesh.slice(procs=1).sleep.call_one(60)
    seen = wait_for(lambda: any("goes to sleep" in ln for ln in procs.logs(rank=1, tail=5)))
    assert seen, f"rank 1 never started its call; its log: {procs.logs(rank=1, tail=5)}"
    os.kill(pid, signal.SIGKILL)
    return pending, ["rank 1 goes to sleep"]


def _die_by_exit(procs, mesh, pid: int):
    return mesh.slice(procs=1).exit_with.call_one(3), ["rank 1 exits with code 3"]


def _die_by_segfault(procs, mesh, pid: int):
    # faulthandler: where the native crash happened, in Python terms.
    return mesh.slice(procs=1).segfault.call_one(), [
        "rank 1 reads address 0",
        "Fatal Python error: Segmentation fault",
        "in segfault",
    ]


def _die_by_memory_limit(procs, mesh, pid: int):
    one = mesh.slice(procs=1)
    one.limit_memory.call_one(32 * MIB).get(timeout=TIMEOUT)
    # The native runtime cannot allocate the message and aborts, saying so (text travels in
    # the message; large bytes would go through the transfer engine).
    return one.size_of.call_one("x" * (100 * MIB)), ["rank 1 limits its memory to", "memory allocation of"]


@pytest.mark.parametrize(
    ("die", "exit_code", "signum"),
    [
        pytest.param(_die_by_kill, None, signal.SIGKILL, id="sigkill"),
        pytest.param(_die_by_exit, 3, None, id="exit-3"),
        pytest.param(_die_by_segfault, None, signal.SIGSEGV, id="segfault"),
        pytest.param(_die_by_memory_limit, None, signal.SIGABRT, id="memory-limit"),
    ],
)
def test_a_worker_death_fails_the_pending_call_with_rank_pid_cause_and_last_output(
    quiet_procs2, die, exit_code, signum
):
    procs = quiet_procs2
    mesh = procs.spawn("mortal", Mortal)
    pid = _worker(procs, 1)["pid"]
    assert mesh.slice(procs=1).pid.call_one().get(timeout=TIMEOUT) == pid
    pending, last_lines = die(procs, mesh, pid)
    with pytest.raises(SupervisionError) as info:
        pending.get(timeout=TIMEOUT)
    err = info.value
    assert not isinstance(err, MeshStoppedError)
    assert err.rank == 1
    assert err.pid == pid
    assert err.exit_code == exit_code
    assert err.signal == signum
    assert "rank 1" in str(err)
    if signum is not None:
        assert signal.Signals(signum).name in str(err)
    else:
        assert f"code {exit_code}" in str(err)
    for line in last_lines:
        assert any(line in ln for ln in err.log_tail), err.log_tail
        assert line in str(err)
    assert still_alive([pid]) == []
    assert "out of memory" not in str(err)  # only what the kernel said (AGENT-3)
    # The other rank goes on.
    assert mesh.slice(procs=0).ping.call_one().get(timeout=TIMEOUT) == 0


@contextlib.contextmanager
def _memory_cgroup(limit: int):
    """A memory cgroup of at most ``limit`` bytes, a child of this process's own
    (cgroup v1 or v2); yields the file whose pid written to it moves a process in.
    Removed afterwards."""
    own = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = next((ln.split(":", 2)[2] for ln in own if "memory" in ln.split(":")[1].split(",")), None)
    if v1 is not None and Path("/sys/fs/cgroup/memory").is_dir():
        group = Path("/sys/fs/cgroup/memory", v1.lstrip("/"), f"monarch-test-oom-{os.getpid()}")
        limit_file = "memory.limit_in_bytes"
    else:
        v2 = next((ln[3:] for ln in own if ln.startswith("0::")), "/")
        group = Path("/sys/fs/cgroup", v2.lstrip("/"), f"monarch-test-oom-{os.getpid()}")
        limit_file = "memory.max"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(limit))
    except OSError as e:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup here ({e}); the OOM label needs one to test")
    try:
        yield group / "cgroup.procs"
    finally:
        for _ in range(50):  # a killed process leaves the group when it is reaped
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_a_worker_the_oom_killer_ends_is_reported_as_out_of_memory(own_procs2):
    mesh = own_procs2.spawn("mortal", Mortal)
    pid = _worker(own_procs2, 1)["pid"]
    with _memory_cgroup(300 * MIB) as procs_file:
        try:
            procs_file.write_text(str(pid))
        except OSError as e:
            pytest.skip(f"cannot move a worker into a memory cgroup here ({e})")
        with pytest.raises(SupervisionError) as info:
            mesh.slice(procs=1).hog.call_one(600 * MIB).get(timeout=TIMEOUT)
    err = info.value
    assert err.rank == 1 and err.signal == signal.SIGKILL
    assert "SIGKILL" in str(err)
    assert "out of memory" in str(err), str(err)
    assert "OOM killer" in str(err)
    assert "rank 1 takes" in str(err)  # its last output, as for any death
    assert mesh.slice(procs=0).ping.call_one().get(timeout=TIMEOUT) == 0


def test_the_death_report_of_a_respawned_worker_quotes_only_its_own_output(own_procs2):
    mesh = own_procs2.spawn("mortal", Mortal)
    with pytest.raises(SupervisionError, match="exits with code 3"):
        mesh.slice(procs=1).exit_with.call_one(3).get(timeout=TIMEOUT)
    assert own_procs2.respawn() == [1]
    # The new worker dies in a call (the report the call raises) ...
    pending = mesh.slice(procs=1).sleep.call_one(60)
    _wait_for_line(own_procs2, 1, "rank 1 goes to sleep")
    os.kill(_worker(own_procs2, 1)["pid"], signal.SIGKILL)
    with pytest.raises(SupervisionError) as info:
        pending.get(timeout=TIMEOUT)
    # ... and the report stored for later calls: its own line, none of the first one's.
    with pytest.raises(SupervisionError) as later:
        mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT)
    for err in (info.value, later.value):
        assert "goes to sleep" in str(err) and "exits with code 3" not in str(err), str(err)
        assert not any("exits with code" in line for line in err.log_tail), err.log_tail
    # A new worker that printed nothing wrote no output, whatever its rank's log holds.
    assert own_procs2.respawn() == [1]
    assert mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT) == 1
    os.kill(_worker(own_procs2, 1)["pid"], signal.SIGKILL)
    with pytest.raises(SupervisionError, match="it wrote no output") as quiet:
        for _ in range(100):  # until the death is known: a later call fails before sending
            mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT)
            time.sleep(0.1)
    assert quiet.value.log_tail == []
    assert "goes to sleep" in "\n".join(own_procs2.logs(rank=1, tail=50))  # the rank's log keeps all


def test_a_plain_kill_is_not_called_out_of_memory_for_a_log_line_that_names_its_pid(own_procs2):
    # AGENT-3: only the kernel's own record of a kill, logged while the worker ran,
    # counts; anyone may write a line to the kernel log (root here), and a record of
    # an older process with the same pid (pid reuse) looks the same as this one.
    mesh = own_procs2.spawn("mortal", Mortal)
    pid = _worker(own_procs2, 1)["pid"]
    try:
        with open("/dev/kmsg", "w") as log:
            log.write(f"<3>Out of memory: Killed process {pid} (python) total-vm:1kB, anon-rss:1kB\n")
    except OSError as e:
        pytest.skip(f"cannot write to the kernel log here ({e})")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(SupervisionError) as info:
        mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT)
    assert info.value.signal == signal.SIGKILL and "SIGKILL" in str(info.value)
    assert "out of memory" not in str(info.value), str(info.value)


# -- failures while the controller is idle --------------------------------------------


def test_on_failure_runs_for_a_worker_killed_while_no_call_is_pending(own_procs2):
    mesh = own_procs2.spawn("mortal", Mortal)
    assert mesh.ping.call().get(timeout=TIMEOUT).values() == [0, 1]
    got: list[MeshFailure] = []
    called = threading.Event()

    @own_procs2.on_failure
    def record(failure: MeshFailure) -> None:
        got.append(failure)
        called.set()

    pid = _worker(own_procs2, 1)["pid"]
    os.kill(pid, signal.SIGKILL)
    assert called.wait(WITHIN), "on_failure was not called"
    failure = got[0]
    assert failure.kind == "dead"
    assert failure.rank == 1
    assert failure.pid == pid
    assert failure.signal == signal.SIGKILL
    assert failure.exit_code is None
    assert failure.mesh == own_procs2.name
    assert "rank 1" in str(failure)
    assert own_procs2.status() == ["alive", "dead"]
    assert own_procs2.degraded
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
        return _rank()


def test_supervise_hook_of_surviving_actors_hears_of_a_dead_rank(own_procs2, tmp_path):
    # A failure does not unpickle the constructor arguments of actor meshes in the
    # controller (they may be large, or do things when unpickled).
    wire = tmp_path / "unpickled-by"
    own_procs2.spawn("armed", Armed, Tripwire(str(wire)))
    mesh = own_procs2.spawn("watcher", Watcher)
    rank0 = mesh.slice(procs=0)
    assert rank0.events.call_one().get(timeout=TIMEOUT) == []
    pid = _worker(own_procs2, 1)["pid"]
    os.kill(pid, signal.SIGKILL)
    seen = wait_for(lambda: rank0.events.call_one().get(timeout=TIMEOUT), every=0.1)
    assert seen == [("dead", 1)]
    assert str(os.getpid()) not in wire.read_text().split(), "the controller unpickled them"


# -- respawn -------------------------------------------------------------------------


def test_respawn_restarts_a_dead_rank_with_its_actors_from_their_constructor(own_procs2):
    counter = own_procs2.spawn("counter", Counter, 10)
    for _ in range(3):
        counter.incr.call().get(timeout=TIMEOUT)
    assert counter.incr.call().get(timeout=TIMEOUT).values() == [14, 14]
    old_pid = counter.slice(procs=1).pid.call_one().get(timeout=TIMEOUT)
    os.kill(old_pid, signal.SIGKILL)
    assert wait_for(lambda: own_procs2.status() == ["alive", "dead"]), own_procs2.status()

    assert own_procs2.respawn() == [1]

    assert own_procs2.status() == ["alive", "alive"]
    assert not own_procs2.degraded
    assert counter.slice(procs=1).incr.call_one().get(timeout=TIMEOUT) == 11  # afresh
    assert counter.slice(procs=0).incr.call_one().get(timeout=TIMEOUT) == 15  # untouched
    assert counter.incr.call().get(timeout=TIMEOUT).values() == [16, 12]
    new_pid = counter.slice(procs=1).pid.call_one().get(timeout=TIMEOUT)
    assert new_pid != old_pid
    assert _worker(own_procs2, 1)["pid"] == new_pid
    assert _worker(own_procs2, 1)["state"] == "running"
    assert still_alive([old_pid]) == []
    assert own_procs2.respawn() == []  # nothing left to restart


# -- unresponsive workers ------------------------------------------------------------


def test_a_stopped_worker_is_unresponsive_then_recovers_on_sigcont(own_procs2):
    mesh = own_procs2.spawn("mortal", Mortal)
    failures = Failures()
    own_procs2.on_failure(failures)
    pid = _worker(own_procs2, 1)["pid"]
    assert mesh.slice(procs=1).pid.call_one().get(timeout=TIMEOUT) == pid
    sigstop(pid)
    try:
        assert wait_for(lambda: own_procs2.status()[1] == "unresponsive"), own_procs2.status()
        assert own_procs2.status() == ["alive", "unresponsive"]
        assert own_procs2.degraded
        hung = failures.wait_for("unresponsive")
        assert hung is not None, failures.kinds()
        assert hung.rank == 1
        assert hung.pid == pid
        assert "SIGSTOP" in str(hung)
        assert _worker(own_procs2, 1)["proc_state"] == "T"
        assert _worker(own_procs2, 1)["state"] == "running"
        assert "dead" not in failures.kinds()
        assert mesh.slice(procs=0).ping.call_one().get(timeout=TIMEOUT) == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_for(lambda: own_procs2.status() == ["alive", "alive"]), own_procs2.status()
    back = failures.wait_for("recovered")
    assert back is not None, failures.kinds()
    assert back.rank == 1
    assert mesh.slice(procs=1).pid.call_one().get(timeout=TIMEOUT) == pid
    assert failures.kinds() == ["unresponsive", "recovered"]


# -- a lost agent --------------------------------------------------------------------


def test_a_killed_agent_loses_the_mesh_its_workers_and_later_calls(own_procs2):
    mesh = own_procs2.spawn("mortal", Mortal)
    failures = Failures()
    own_procs2.on_failure(failures)
    workers = [w["pid"] for w in _workers(own_procs2)]
    agent = own_procs2._session("test").agent.popen
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait(TIMEOUT)
    assert still_alive(workers) == []
    lost = failures.wait_for("lost")
    assert lost is not None, failures.kinds()
    assert lost.mesh == own_procs2.name
    assert "lost" in str(lost)
    assert own_procs2.status() == ["lost", "lost"]
    with pytest.raises(SupervisionError, match="is lost") as info:
        mesh.ping.call().get(timeout=TIMEOUT)
    assert own_procs2.name in str(info.value)
    with pytest.raises(SupervisionError, match="is lost"):
        mesh.slice(procs=0).ping.call_one().get(timeout=TIMEOUT)
    own_procs2.stop()  # must not raise
    assert own_procs2.status() == ["stopped", "stopped"]


# -- output --------------------------------------------------------------------------


def test_logs_gives_the_last_lines_of_one_rank(own_procs2):
    mesh = own_procs2.spawn("speaker", Speaker)
    mesh.say.call("hello").get(timeout=TIMEOUT)
    lines = wait_for(lambda: [ln for ln in own_procs2.logs(rank=1, tail=5) if "hello from" in ln], every=0.1)
    assert lines == ["hello from rank 1"]
    both = wait_for(lambda: sorted(ln for ln in own_procs2.logs(tail=100) if "hello from" in ln), every=0.1)
    assert both == ["hello from rank 0", "hello from rank 1"]


def test_logs_of_every_rank_come_in_the_order_they_were_printed_labelled(own_procs2):
    mesh = own_procs2.spawn("speaker_order", Speaker)
    # rank 1, 0, 1, 0 in turn, each line recorded by the agent before the next is printed
    said = []
    for i, rank in enumerate([1, 0, 1, 0]):
        text = f"turn {i}"
        mesh.slice(procs=rank).say.call(text).get(timeout=TIMEOUT)
        assert wait_for(
            lambda t=text, r=rank: f"{t} from rank {r}" in own_procs2.logs(rank=r, tail=5), every=0.05
        )
        said.append(f"[rank {rank}] {text} from rank {rank}")
    lines = [ln for ln in own_procs2.logs(tail=100, labelled=True) if " turn " in ln]
    assert lines == said  # not rank by rank


def test_stream_logs_gives_new_lines_of_one_rank_as_they_come(own_procs2):
    mesh = own_procs2.spawn("speaker", Speaker)
    stream = own_procs2.stream_logs(rank=0)
    lines: list[str] = []
    arrived = threading.Event()

    def follow() -> None:
        try:
            for line in stream:
                lines.append(line)
                if "ping" in line:
                    arrived.set()
                    break
        finally:
            stream.close()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    # The stream may start after the first lines: speak until one arrives.
    deadline = time.monotonic() + WITHIN
    i = 0
    while not arrived.is_set() and time.monotonic() < deadline:
        mesh.say.call(f"ping {i}").get(timeout=TIMEOUT)
        i += 1
        arrived.wait(0.2)
    assert arrived.is_set(), f"no line came; got {lines}"
    follower.join(TIMEOUT)
    assert not follower.is_alive()
    ours = [ln for ln in lines if "ping" in ln]
    assert len(ours) == 1
    assert ours[0].startswith(f"[{own_procs2.name} 0] ping ")
    assert ours[0].endswith(" from rank 0")
    assert not any("from rank 1" in ln for ln in lines)


def test_a_controller_that_falls_behind_is_told_how_many_lines_it_missed(own_procs2, request):
    from monarch_kernel import controller

    gate, notices, shown = threading.Event(), [], []

    def stuck_sink(session: Any, line: Any) -> None:  # a notebook too busy to take output
        gate.wait(WITHIN)
        shown.append(line.text)

    before = controller.frontend()
    controller.set_frontend(controller.Frontend(on_line=stuck_sink, on_notice=notices.append))
    request.addfinalizer(lambda: controller.set_frontend(before))
    mesh = own_procs2.spawn("speaker", Speaker)
    mesh.slice(procs=0).flood.call_one(120_000).get(timeout=TIMEOUT)  # more than the agent keeps
    gate.set()
    assert wait_for(lambda: notices), f"no notice; {len(shown)} lines shown"
    said = re.search(r"(\d+) lines of worker output were not shown", notices[0])
    assert said and int(said.group(1)) > 0, notices
    assert "%mesh logs" in notices[0]
    # Every line is still in the log file.
    assert wait_for(lambda: own_procs2.logs(rank=0, tail=1)[0].endswith(" flood 119999"), every=0.2)
    assert mesh.say.call("after").get(timeout=TIMEOUT) is not None  # the mesh goes on


def test_a_plain_script_prints_worker_output_with_mesh_and_rank(state_home):
    script = textwrap.dedent(
        """
        import sys
        import time
        from monarch_kernel import Actor, current_rank, endpoint, this_host

        class Greeter(Actor):
            @endpoint
            def greet(self):
                if current_rank()["procs"] == 1:
                    print("worker says hi", flush=True)
                return current_rank()["procs"]

        procs = this_host().spawn_procs(per_host={"procs": 2})
        try:
            print("mesh", procs.name, flush=True)
            ranks = procs.spawn("greeter", Greeter).greet.call().get(timeout=30).values()
            print("ranks", ranks, file=sys.stderr, flush=True)  # not interleaved with forwarded lines
            time.sleep(1.0)
        finally:
            procs.stop()
        """
    )
    env = dict(os.environ)
    env.pop("MONARCH_FORWARD_OUTPUT", None)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    name = next(ln.split()[1] for ln in out if ln.startswith("mesh "))
    assert name.startswith("anon-")
    assert "ranks [0, 1]" in done.stderr
    assert f"[{name} 1] worker says hi" in out, done.stdout
    assert not any(ln.startswith(f"[{name} 0]") and "worker says hi" in ln for ln in out)
