"""An actor's life with Monarch's meaning: ``__cleanup__`` exactly once (sync and
async), finalizers when its proc mesh stops, and the mesh-wide options Monarch code
sets (``logging_option``, ``with_python_executable``, ``shutdown_context``)."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import pytest

from monarch_kernel import Actor, endpoint, shutdown_context, this_host
from monarch_kernel.errors import MeshSpecError


class Journal(Actor):
    """Writes what happens to it to a file."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _write(self, line: str) -> None:
        with self.path.open("a") as f:
            f.write(line + "\n")

    @endpoint
    def ping(self) -> int:
        return os.getpid()

    def __cleanup__(self, exc: object) -> None:
        self._write("cleanup")

    def __del__(self) -> None:
        self._write("del")


class AsyncJournal(Actor):
    def __init__(self, path: str) -> None:
        self.path = Path(path)

    @endpoint
    async def ping(self) -> int:
        return os.getpid()

    async def __cleanup__(self, exc: object) -> None:
        with self.path.open("a") as f:
            f.write("cleanup\n")


class Logs(Actor):
    @endpoint
    def level(self) -> int:
        return logging.getLogger().level

    @endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)

    @endpoint
    def executable(self) -> str:
        return sys.executable


def _lines(path: Path, want: str, limit: float = 20.0) -> list[str]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if want in lines:
            time.sleep(0.3)  # anything that would come twice has come by now
            return path.read_text().splitlines()
        time.sleep(0.1)
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("cls", [Journal, AsyncJournal])
def test_cleanup_runs_exactly_once_when_the_actor_stops_and_not_again_with_its_mesh(
    fresh_procs1, tmp_path, cls
):
    log = tmp_path / "log"
    mesh = fresh_procs1.spawn("journal", cls, str(log))
    mesh.ping.call_one().get(timeout=30)
    mesh.stop().get(timeout=30)
    assert _lines(log, "cleanup").count("cleanup") == 1
    fresh_procs1.stop()
    time.sleep(1.0)
    assert log.read_text().splitlines().count("cleanup") == 1


def test_cleanup_runs_once_when_the_proc_mesh_stops(state_home, tmp_path):
    log = tmp_path / "log"
    procs = this_host().spawn_procs(per_host={"procs": 2})
    procs.spawn("journal", Journal, str(log)).ping.call().get(timeout=30)
    procs.stop()
    assert _lines(log, "cleanup").count("cleanup") == 2


def test_finalizers_run_when_the_proc_mesh_stops(state_home, tmp_path):
    log = tmp_path / "log"
    procs = this_host().spawn_procs(per_host={"procs": 1})
    procs.spawn("journal", Journal, str(log)).ping.call_one().get(timeout=30)
    procs.stop()
    lines = _lines(log, "del")
    assert lines.count("del") == 1 and lines.index("cleanup") < lines.index("del")


def test_logging_option_sets_the_workers_log_level(fresh_procs1):
    mesh = fresh_procs1.spawn("logs", Logs)
    fresh_procs1.logging_option(stream_to_client=True, aggregate_window_sec=None, level=logging.WARNING)
    assert mesh.level.call_one().get(timeout=30) == logging.WARNING


def test_logging_option_is_awaited_or_run_as_monarchs_async_method_is(fresh_procs1):
    import asyncio

    mesh = fresh_procs1.spawn("logs", Logs)
    asyncio.run(fresh_procs1.logging_option(level=logging.ERROR))  # Monarch's docs do this
    assert mesh.level.call_one().get(timeout=30) == logging.ERROR

    async def awaited() -> None:
        await fresh_procs1.logging_option(level=logging.DEBUG)

    asyncio.run(awaited())
    assert mesh.level.call_one().get(timeout=30) == logging.DEBUG
    assert fresh_procs1.logging_option(level=logging.INFO).get() is None  # and not awaited at all
    assert mesh.level.call_one().get(timeout=30) == logging.INFO


def test_logging_option_stream_to_client_false_keeps_lines_in_logs_only(fresh_procs1, capfd):
    mesh = fresh_procs1.spawn("logs", Logs)
    fresh_procs1.logging_option(stream_to_client=False)
    mesh.say.call_one("quiet line").get(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any("quiet line" in line for line in fresh_procs1.logs()):
        time.sleep(0.1)
    assert any("quiet line" in line for line in fresh_procs1.logs())
    time.sleep(0.5)
    assert "quiet line" not in capfd.readouterr().out


def test_logging_option_refuses_a_bad_window_naming_it(fresh_procs1):
    with pytest.raises(ValueError, match="aggregate_window_sec"):
        fresh_procs1.logging_option(aggregate_window_sec=-1)


def test_with_python_executable_runs_the_workers_with_that_interpreter(state_home, tmp_path):
    link = tmp_path / "python-for-workers"
    link.symlink_to(sys.executable)
    procs = this_host().with_python_executable(str(link)).spawn_procs(per_host={"procs": 1})
    try:
        assert procs.spawn("logs", Logs).executable.call_one().get(timeout=30) == str(link)
    finally:
        procs.stop()


def test_with_python_executable_refuses_a_path_that_is_not_there(tmp_path):
    with pytest.raises(MeshSpecError, match="no executable there"):
        this_host().with_python_executable(str(tmp_path / "nope"))


def test_shutdown_context_stops_this_processes_unnamed_meshes(state_home):
    procs = this_host().spawn_procs(per_host={"procs": 1})
    pid = procs.spawn("logs", Journal, os.devnull).ping.call_one().get(timeout=30)
    shutdown_context().get(timeout=30)
    assert procs.status() == ["stopped"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")


_bootstrapped: list[str] = []


def _setup() -> None:
    os.environ["BOOTSTRAPPED"] = "sync"


async def _setup_async() -> None:
    import asyncio

    await asyncio.sleep(0)
    os.environ["BOOTSTRAPPED"] = "async"


def _setup_fails() -> None:
    raise RuntimeError("no scratch disk")


class Env(Actor):
    @endpoint
    def get(self, key: str) -> str | None:
        self.logger.info("asked for %s", key)  # Monarch's Actor.logger
        return os.environ.get(key)


@pytest.mark.parametrize(("setup", "expected"), [(_setup, "sync"), (_setup_async, "async")])
def test_spawn_procs_runs_bootstrap_on_every_proc_first(state_home, setup, expected):
    procs = this_host().spawn_procs(per_host={"procs": 2}, bootstrap=setup)
    try:
        assert (
            list(procs.spawn("env", Env).get.call("BOOTSTRAPPED").get(timeout=30).values()) == [expected] * 2
        )
    finally:
        procs.stop()


def test_a_bootstrap_that_raises_fails_spawn_procs_naming_the_error(state_home):
    from monarch_kernel import ActorError

    with pytest.raises(ActorError, match="no scratch disk"):
        this_host().spawn_procs(per_host={"procs": 1}, bootstrap=_setup_fails)


class SelfEnding(Actor):
    @endpoint
    def abort(self, reason: str | None = None) -> str:
        from monarch_kernel import context

        context().actor_instance.abort(reason)
        return "answered"

    @endpoint
    def stop_me(self) -> str:
        from monarch_kernel import context

        context().actor_instance.stop()
        return "answered"

    @endpoint
    def creator_name(self) -> str | None:
        from monarch_kernel import context

        creator = context().actor_instance.creator
        return creator.name if creator is not None else None

    @endpoint
    def ping(self) -> str:
        return "pong"


def test_an_actor_that_aborts_answers_its_call_then_fails_and_supervision_hears_why(fresh_procs1):
    from monarch_kernel import SupervisionError

    heard: list[object] = []
    fresh_procs1.on_failure(heard.append)
    actor = fresh_procs1.spawn("aborting", SelfEnding)
    assert actor.abort.call_one("out of disk").get(timeout=30) == "answered"
    deadline = time.monotonic() + 30
    while not heard and time.monotonic() < deadline:
        time.sleep(0.05)
    assert heard and "out of disk" in heard[0].report()  # type: ignore[attr-defined]
    with pytest.raises(SupervisionError, match="aborted: out of disk"):
        actor.ping.call_one().get(timeout=30)


def test_an_actor_that_stops_itself_answers_its_call_then_is_gone(fresh_procs1):
    from monarch_kernel import MeshStoppedError

    actor = fresh_procs1.spawn("stopping", SelfEnding)
    assert actor.stop_me.call_one().get(timeout=30) == "answered"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            actor.ping.call_one().get(timeout=30)
        except MeshStoppedError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the actor still answers after stopping itself")


def test_an_actors_creator_is_the_controller_that_spawned_its_procs(fresh_procs1):
    assert fresh_procs1.spawn("creator", SelfEnding).creator_name.call_one().get(timeout=30) == "root"
