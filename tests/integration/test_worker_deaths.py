"""How each kind of worker death reaches a pending call, with real workers: the
``SupervisionError`` names the rank, the pid, the cause (exit code, signal, the OOM
killer) and the worker's last output, of this worker only. (Supervision while idle,
respawn, hung workers and a lost agent: ``test_supervision.py``.)"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from mortal import Mortal, worker_of
from proc_helpers import still_alive, wait_for

from monarch_kernel import MeshStoppedError, SupervisionError, this_host

TIMEOUT = 30
MIB = 1024 * 1024


def _wait_for_line(procs, rank: int, text: str) -> None:
    """Until ``rank``'s log has a line with ``text``."""
    deadline = time.monotonic() + TIMEOUT
    while not any(text in line for line in procs.logs(rank=rank, tail=20)):
        assert time.monotonic() < deadline, f"rank {rank} never printed {text!r}"
        time.sleep(0.05)


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
    pid = worker_of(procs, 1)["pid"]
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


def test_a_worker_the_oom_killer_ends_is_reported_as_out_of_memory(fresh_procs2):
    mesh = fresh_procs2.spawn("mortal", Mortal)
    pid = worker_of(fresh_procs2, 1)["pid"]
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


def test_the_death_report_of_a_respawned_worker_quotes_only_its_own_output(fresh_procs2):
    mesh = fresh_procs2.spawn("mortal", Mortal)
    with pytest.raises(SupervisionError, match="exits with code 3"):
        mesh.slice(procs=1).exit_with.call_one(3).get(timeout=TIMEOUT)
    assert fresh_procs2.respawn() == [1]
    # The new worker dies in a call (the report the call raises) ...
    pending = mesh.slice(procs=1).sleep.call_one(60)
    _wait_for_line(fresh_procs2, 1, "rank 1 goes to sleep")
    os.kill(worker_of(fresh_procs2, 1)["pid"], signal.SIGKILL)
    with pytest.raises(SupervisionError) as info:
        pending.get(timeout=TIMEOUT)
    # ... and the report stored for later calls: its own line, none of the first one's.
    with pytest.raises(SupervisionError) as later:
        mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT)
    for err in (info.value, later.value):
        assert "goes to sleep" in str(err) and "exits with code 3" not in str(err), str(err)
        assert not any("exits with code" in line for line in err.log_tail), err.log_tail
    # A new worker that printed nothing wrote no output, whatever its rank's log holds.
    assert fresh_procs2.respawn() == [1]
    assert mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT) == 1
    os.kill(worker_of(fresh_procs2, 1)["pid"], signal.SIGKILL)
    with pytest.raises(SupervisionError, match="it wrote no output") as quiet:
        for _ in range(100):  # until the death is known: a later call fails before sending
            mesh.slice(procs=1).ping.call_one().get(timeout=TIMEOUT)
            time.sleep(0.1)
    assert quiet.value.log_tail == []
    assert "goes to sleep" in "\n".join(fresh_procs2.logs(rank=1, tail=50))  # the rank's log keeps all


def test_a_plain_kill_is_not_called_out_of_memory_for_a_log_line_that_names_its_pid(fresh_procs2):
    # AGENT-3: only the kernel's own record of a kill, logged while the worker ran,
    # counts; anyone may write a line to the kernel log (root here), and a record of
    # an older process with the same pid (pid reuse) looks the same as this one.
    mesh = fresh_procs2.spawn("mortal", Mortal)
    pid = worker_of(fresh_procs2, 1)["pid"]
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
