"""Persistent named meshes: get-or-create, state files, reattach after the controller
is killed, epoch fencing, idle timeout, ephemeral meshes, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
import warnings

import pytest
from proc_helpers import still_alive, wait_for

from monarch_kernel import (
    Actor,
    MeshNotFoundError,
    MeshOwnershipError,
    attach,
    endpoint,
    list_meshes,
    this_host,
)
from monarch_kernel.errors import MeshSpecError, MeshStoppedError
from monarch_kernel.hosts import _registry
from monarch_kernel.hosts._registry import MeshStateWarning

TIMEOUT = 30


def _name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _pids(procs) -> list[int]:
    return [w["pid"] for w in procs._session("test").client.list_workers()]


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.v = start

    @endpoint
    def incr(self) -> int:
        self.v += 1
        return self.v


class Cleaned(Actor):
    """Its __cleanup__ leaves a mark in the worker's module state."""

    @endpoint
    def version(self) -> int:
        return 1

    def __cleanup__(self, exc: object) -> None:
        import builtins

        builtins._monarch_test_cleanups = getattr(builtins, "_monarch_test_cleanups", 0) + 1  # type: ignore[attr-defined]


class CleanedV2(Actor):
    @endpoint
    def version(self) -> int:
        return 2

    @endpoint
    def cleanups(self) -> int:
        import builtins

        return getattr(builtins, "_monarch_test_cleanups", 0)


# A controller in another process: creates (or attaches to) a mesh, prints READY and
# what it saw, then runs commands read from stdin ("call", "spawn", "exit").
_CONTROLLER = textwrap.dedent(
    """
    import os, sys
    from monarch_kernel import Actor, endpoint, this_host, attach

    class Counter(Actor):  # defined in __main__: travels by value
        def __init__(self, start):
            self.v = start
        @endpoint
        def incr(self):
            self.v += 1
            return self.v
        @endpoint
        def module_state(self):
            import builtins
            return getattr(builtins, "_monarch_mark", None)
        @endpoint
        def set_module_state(self, v):
            import builtins
            builtins._monarch_mark = v

    name, kw = sys.argv[1], eval(sys.argv[2])
    procs = this_host().spawn_procs(per_host={"procs": 2}, name=name, **kw)
    c = procs.spawn("counter", Counter, 10)
    c.set_module_state.call(f"set by {os.getpid()}").get()
    print("READY", list(c.incr.call().get().values()), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        try:
            if cmd == "call":
                print("OK", list(c.incr.call().get(timeout=30).values()), flush=True)
            elif cmd == "spawn":
                procs.spawn("other", Counter, 0)
                print("OK spawned", flush=True)
            elif cmd == "exit":
                break
        except Exception as e:
            print("ERR", type(e).__name__, str(e).replace(chr(10), " "), flush=True)
    """
)


class Controller:
    """A controller process running ``_CONTROLLER``."""

    def __init__(self, name: str, **kw: object) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", _CONTROLLER, name, repr(kw)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "MONARCH_FORWARD_OUTPUT": "0"},
        )
        self.ready = self.line()
        assert self.ready.startswith("READY"), self.ready + self.p.stderr.read()  # type: ignore[union-attr]

    def line(self) -> str:
        assert self.p.stdout is not None
        return self.p.stdout.readline().strip()

    def send(self, cmd: str) -> str:
        assert self.p.stdin is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.line()

    def kill(self) -> None:
        self.p.kill()
        self.p.wait(10)

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.send("exit")
                self.p.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()


def _stop(name: str) -> None:
    rec = _registry.read(name)
    if rec is not None:
        from monarch_kernel.controller import stop_record

        stop_record(rec)


def test_a_named_mesh_is_get_or_create_and_a_different_spec_is_an_error():
    name = _name()
    procs = this_host().spawn_procs(per_host={"procs": 2}, name=name)
    try:
        pids = _pids(procs)
        again = this_host().spawn_procs(per_host={"procs": 2}, name=name)
        assert _pids(again) == pids
        with pytest.raises(MeshSpecError, match="replace=True") as info:
            this_host().spawn_procs(per_host={"procs": 3}, name=name)
        assert "{'procs': 2}" in str(info.value) and "attach(" in str(info.value)
        replaced = this_host().spawn_procs(per_host={"procs": 3}, name=name, replace=True)
        try:
            assert len(_pids(replaced)) == 3
            assert not still_alive(pids)
            with pytest.raises(MeshStoppedError):
                procs.spawn("c", Counter, 0)
        finally:
            replaced.stop()
    finally:
        procs.stop()
    assert _registry.read(name) is None


def test_bad_names_and_options_are_clear_errors():
    with pytest.raises(MeshSpecError, match="not valid"):
        this_host().spawn_procs(per_host={"procs": 1}, name="no spaces")
    with pytest.raises(MeshSpecError, match="idle_timeout"):
        this_host().spawn_procs(per_host={"procs": 1}, name=_name(), idle_timeout=-1)
    with pytest.raises(MeshNotFoundError, match="spawn_procs"):
        attach(_name())


def test_the_state_file_is_private_and_list_meshes_shows_the_mesh():
    name = _name()
    procs = this_host().spawn_procs(per_host={"procs": 2}, name=name)
    try:
        path = _registry.path_of(name)
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.parent.stat().st_mode & 0o777 == 0o700
        data = json.loads(path.read_text())
        assert data["spec"] == {"per_host": {"procs": 2}, "env": {}}
        assert data["token"] and data["epoch"] >= 1
        (info,) = [m for m in list_meshes() if m.name == name]
        assert (info.procs, info.alive, info.attached, info.ephemeral) == (2, 2, True, False)
        assert info.idle_timeout == 24 * 3600
    finally:
        procs.stop()
    assert not path.exists()
    assert name not in [m.name for m in list_meshes()]


def test_a_new_process_reattaches_after_the_controller_is_killed_with_state_intact():
    name = _name()
    ctl = Controller(name)
    try:
        assert ctl.ready == "READY [11, 11]"
        rec = _registry.read(name)
        assert rec is not None
        worker_pids = [w["pid"] for w in _client(rec).list_workers()]
        ctl.kill()
        procs = attach(name)
        try:
            assert _pids(procs) == worker_pids  # the same processes
            c = procs.actors["counter"]
            assert list(c.incr.call().get(timeout=TIMEOUT).values()) == [12, 12]
            assert set(c.module_state.call().get(timeout=TIMEOUT).values()) == {f"set by {ctl.p.pid}"}
            assert list(procs.actors) == ["counter"]
            with pytest.raises(KeyError, match="counter"):
                procs.actors["nope"]
        finally:
            procs.stop()
        assert not still_alive(worker_pids)
    finally:
        ctl.close()
        _stop(name)


def test_attaching_fences_the_previous_controller():
    name = _name()
    ctl = Controller(name)
    try:
        assert ctl.send("call").startswith("OK [12, 12]")
        procs = attach(name)
        try:
            reply = ctl.send("call")
            assert reply.startswith("ERR MeshOwnershipError"), reply
            assert f"attach('{name}')" in reply
            reply = ctl.send("spawn")
            assert reply.startswith("ERR MeshOwnershipError"), reply
            # The new controller goes on, with the state the old one left.
            assert list(procs.actors["counter"].incr.call().get(timeout=TIMEOUT).values()) == [13, 13]
            assert [m.owner_epoch for m in list_meshes() if m.name == name] == [procs._session("t").epoch]
        finally:
            procs.stop()
    finally:
        ctl.close()
        _stop(name)


def test_a_controller_fenced_in_the_same_process_gets_mesh_ownership_error_from_the_agent():
    name = _name()
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=name)
    try:
        session = procs._session("t")
        old_epoch = session.epoch
        again = attach(name)
        assert again._session("t").epoch == old_epoch + 1
        with pytest.raises(MeshOwnershipError):
            session.client.respawn_workers([0], old_epoch)
    finally:
        _stop(name)


def test_an_idle_mesh_stops_after_its_idle_timeout():
    name = _name()
    ctl = Controller(name, idle_timeout=1.0)
    rec = _registry.read(name)
    assert rec is not None
    pids = [w["pid"] for w in _client(rec).list_workers()] + [rec.agent_pid]
    ctl.close()  # a clean exit: a persistent mesh is not stopped, only let go
    try:
        assert not still_alive(pids, within=10.0)
        assert _registry.read(name) is None
    finally:
        _stop(name)


def test_a_named_mesh_outlives_a_clean_exit_of_its_controller():
    name = _name()
    ctl = Controller(name)
    ctl.close()
    try:
        procs = attach(name)
        assert list(procs.actors["counter"].incr.call().get(timeout=TIMEOUT).values()) == [12, 12]
    finally:
        _stop(name)


def test_an_ephemeral_mesh_stops_when_its_controller_is_killed():
    name = _name()
    ctl = Controller(name, ephemeral=True)
    rec = _registry.read(name)
    assert rec is not None and rec.ephemeral
    pids = [w["pid"] for w in _client(rec).list_workers()] + [rec.agent_pid]
    ctl.kill()
    try:
        assert not still_alive(pids)
        assert _registry.read(name) is None
    finally:
        _stop(name)


def test_spawning_an_actor_mesh_under_a_used_name_replaces_it_and_runs_cleanup():
    name = _name()
    procs = this_host().spawn_procs(per_host={"procs": 2}, name=name)
    try:
        pids = _pids(procs)
        a = procs.spawn("a", Cleaned)
        assert list(a.version.call().get(timeout=TIMEOUT).values()) == [1, 1]
        b = procs.spawn("a", CleanedV2)
        assert list(b.version.call().get(timeout=TIMEOUT).values()) == [2, 2]
        assert list(b.cleanups.call().get(timeout=TIMEOUT).values()) == [1, 1]
        assert _pids(procs) == pids
        # A later controller finds the replacement, not the original.
        assert attach(name).actors["a"]._class is CleanedV2
    finally:
        _stop(name)


class Notes(Actor):
    """Its __cleanup__ writes a line to a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    def ping(self) -> int:
        return os.getpid()

    def __cleanup__(self, exc: object) -> None:
        with open(self.path, "a") as f:
            f.write(f"sync {os.getpid()}\n")


class AsyncNotes(Actor):
    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    async def ping(self) -> int:
        return os.getpid()

    async def __cleanup__(self, exc: object) -> None:
        with open(self.path, "a") as f:
            f.write(f"async {os.getpid()}\n")


def test_stopping_the_mesh_runs_every_actors_cleanup(tmp_path):
    notes = tmp_path / "cleanups"
    procs = this_host().spawn_procs(per_host={"procs": 2})
    pids = _pids(procs)
    procs.spawn("s", Notes, str(notes)).ping.call().get(timeout=TIMEOUT)
    procs.spawn("a", AsyncNotes, str(notes)).ping.call().get(timeout=TIMEOUT)
    procs.stop()
    lines = sorted(notes.read_text().splitlines())
    assert lines == sorted(f"{kind} {pid}" for kind in ("async", "sync") for pid in pids)
    assert not still_alive(pids)


class Holder(Actor):
    """Keeps what its constructor got (large constructor arguments)."""

    def __init__(self, blob: bytes) -> None:
        self.n = len(blob)

    @endpoint
    def held(self) -> int:
        return self.n


@pytest.mark.slow
def test_actor_meshes_with_large_constructor_arguments_are_recorded_and_reattached():
    name = _name()
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=name)
    try:
        for i in range(2):  # 2 x 40 MiB of records: above 4 MiB each, 64 MiB in all
            procs.spawn(f"h{i}", Holder, bytes(40 << 20))
        again = attach(name)
        assert sorted(again.actors) == ["h0", "h1"]
        assert again.actors["h1"].held.call().get(timeout=TIMEOUT).values() == [40 << 20]
    finally:
        _stop(name)


def _record(name: str, host_id: str) -> _registry.MeshRecord:
    """A state file of a mesh whose agent, on host ``host_id``, is not there."""
    return _registry.MeshRecord(
        name=name,
        token="x" * 43,
        agent_addr="127.0.0.1:1",  # nothing listens there
        agent_pid=999999,  # and no process has that pid
        host=host_id.split("/")[0] or "nowhere",
        spec={"per_host": {"procs": 1}, "env": {}},
        idle_timeout=60.0,
        ephemeral=False,
        host_id=host_id,
        started_from=host_id,
    )


def test_a_corrupt_or_stale_state_file_is_reported_and_removed():
    from monarch_kernel.hosts._host_id import host_id

    bad = _registry.path_of("corrupt-one")
    bad.write_text("{not json")
    stale_name = _name()
    _registry.write(_record(stale_name, host_id()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = [m.name for m in list_meshes()]
    assert "corrupt-one" not in names and stale_name not in names
    messages = [str(w.message) for w in caught if issubclass(w.category, MeshStateWarning)]
    assert any("corrupt" in m for m in messages), messages
    assert any(stale_name in m and "gone" in m for m in messages), messages
    assert not bad.exists() and _registry.read(stale_name) is None
    # attach and spawn_procs cope with them too.
    bad.write_text("[]")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(MeshNotFoundError):
            attach("corrupt-one")
        procs = this_host().spawn_procs(per_host={"procs": 1}, name="corrupt-one")
    procs.stop()


def test_a_running_meshs_agent_puts_back_a_state_file_that_was_corrupted_or_deleted():
    name = _name()
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=name)
    try:
        token = _registry.read(name).token
        path = _registry.path_of(name)
        time.sleep(1.0)  # the agent has read the file by now
        for damage in (lambda: path.write_text("{not json"), path.unlink):
            damage()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                back = wait_for(lambda: _registry.read(name))
            assert back is not None and back.token == token
            assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert name in [m.name for m in list_meshes()]
    finally:
        procs.stop()
    assert _registry.read(name) is None  # a stopped mesh's file stays gone


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monarch_kernel", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_the_cli_lists_and_stops_meshes():
    names = [_name(), _name()]
    meshes = [this_host().spawn_procs(per_host={"procs": 1}, name=n) for n in names]
    try:
        out = _cli("ls")
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[0].split()[:3] == ["NAME", "PROCS", "ALIVE"]
        rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:]}
        assert rows[names[0]][1:3] == ["1", "1"]
        pids = _pids(meshes[0])
        out = _cli("down", names[0])
        assert out.returncode == 0 and f"stopped {names[0]}" in out.stdout
        assert not still_alive(pids)
        assert names[0] not in _cli("ls").stdout
        out = _cli("down", "no-such-mesh")
        assert out.returncode == 1 and "no mesh named" in out.stderr
        assert _cli("down").returncode == 2
        # This process is attached to the other mesh: --all leaves it, --force stops it.
        out = _cli("down", "--all")
        assert out.returncode == 0 and f"left running: {names[1]}" in out.stderr
        assert names[1] in _cli("ls").stdout
        out = _cli("down", "--all", "--force", "--yes")
        assert out.returncode == 0 and f"stopped {names[1]}" in out.stdout
        assert _cli("ls").stdout.strip() == "no running meshes"
    finally:
        for n in names:
            _stop(n)


def _client(rec):
    from monarch_kernel.control import agent_client

    return agent_client(rec.agent_addr, rec.token)


@pytest.mark.slow
def test_a_fenced_controller_cannot_stop_the_mesh_but_takes_it_back_by_spawn_procs():
    name = _name()
    ctl = Controller(name)
    try:
        procs = attach(name)
        reply = ctl.send("call")
        assert reply.startswith("ERR MeshOwnershipError"), reply
        # The other controller takes it back (rerunning its spawn_procs cell would
        # do the same); now this process is the fenced one.
        ctl.close()
        again = Controller(name)
        try:
            assert again.ready == "READY [11, 11]"  # its spawn() replaced the actor mesh
            with pytest.raises(MeshOwnershipError):
                procs.stop()
            assert _registry.read(name) is not None  # not removed by the refused stop
            mine = this_host().spawn_procs(per_host={"procs": 2}, name=name)
            assert list(mine.actors["counter"].incr.call().get(timeout=TIMEOUT).values()) == [12, 12]
            assert again.send("call").startswith("ERR MeshOwnershipError")
            mine.stop()
        finally:
            again.close()
    finally:
        ctl.close()
        _stop(name)


def test_stopping_a_slice_keeps_the_actor_mesh_for_later_controllers():
    name = _name()
    procs = this_host().spawn_procs(per_host={"procs": 2}, name=name)
    try:
        c = procs.spawn("counter", Counter, 0)
        c.slice(procs=1).stop().get(timeout=TIMEOUT)
        assert list(attach(name).actors) == ["counter"]  # rank 0's actor still runs
        procs = attach(name)
        procs.actors["counter"].stop().get(timeout=TIMEOUT)
        assert list(attach(name).actors) == []
    finally:
        _stop(name)


def test_a_proc_mesh_shows_as_a_table_in_html_and_text():
    import IPython.lib.pretty

    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        html = procs._repr_html_()
        assert html.count("<tr>") == 3 and "alive" in html and "<th>pid</th>" in html
        text = IPython.lib.pretty.pretty(procs)
        assert "rank 1: alive" in text and text.startswith("ProcMesh(")
    finally:
        procs.stop()
    assert "stopped" in procs._repr_html_()
