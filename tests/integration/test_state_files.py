"""No running agent is ever unlisted (real agents): the agent writes its mesh's state
file as soon as it listens, puts it back from the first moment, and a mesh whose file
is being put back is not taken for gone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
import warnings

import pytest
from proc_helpers import wait_for

from monarch_kernel import attach, list_meshes, this_host
from monarch_kernel.control import AgentClient
from monarch_kernel.controller import stop_record
from monarch_kernel.hosts import AgentProcess, _registry


def _name() -> str:
    return f"sf-{uuid.uuid4().hex[:6]}"


def test_an_interrupt_right_after_the_agent_starts_leaves_nothing_unlisted(state_home, monkeypatch):
    name = _name()

    def interrupted(*_a, **_k):  # Ctrl-C during the first spawn...
        raise KeyboardInterrupt

    def cleanup_interrupted(*_a, **_k):  # ...and again during the clean-up
        raise KeyboardInterrupt

    monkeypatch.setattr(AgentClient, "spawn_workers_raw", interrupted)
    monkeypatch.setattr(AgentClient, "shutdown", cleanup_interrupted)
    monkeypatch.setattr(AgentProcess, "wait", cleanup_interrupted)
    with pytest.raises(KeyboardInterrupt):
        this_host().spawn_procs(per_host={"procs": 1}, name=name)
    monkeypatch.undo()
    # The agent the interrupted clean-up left runs on, but it is listed, and down ends it.
    rec = _registry.read(name)
    assert rec is not None and rec.agent_pid
    assert name in [m.name for m in list_meshes()]
    assert stop_record(rec)
    assert _registry.read(name) is None


def test_a_state_file_deleted_right_after_creation_is_put_back(state_home):
    name = _name()
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=name)
    try:
        _registry.path_of(name).unlink()
        assert wait_for(lambda: _registry.read(name) is not None)
    finally:
        procs.stop()


def test_attach_while_a_corrupt_state_file_is_being_put_back_finds_the_mesh(state_home):
    name = _name()
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=name)
    try:
        procs._session("test").detach()
        _registry.path_of(name).write_text("{not json")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the corrupt file is reported)
            again = attach(name)
        assert again.status() == ["alive"]
    finally:
        rec = _registry.read(name)
        if rec is not None:
            stop_record(rec)


def test_attach_with_a_state_folder_that_cannot_be_written_fences_nobody(state_home, monkeypatch):
    from monarch_kernel import errors

    name = _name()
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=name)
    session = procs._session("test")
    epoch = session.client.ping()["epoch"]
    session.detach()
    real_write = _registry.write

    def read_only(rec):  # (tests run as root, whom file modes do not stop)
        raise _registry.MeshStateError(
            f"mesh {rec.name!r}: cannot write its state file in {_registry.meshes_dir()}"
        )

    monkeypatch.setattr(_registry, "write", read_only)
    try:
        with pytest.raises(errors.MeshStateError) as info:
            attach(name)
        assert str(_registry.meshes_dir()) in str(info.value)
        assert isinstance(info.value, OSError) and isinstance(info.value, errors.MonarchKernelError)
        rec = _registry.read(name)
        assert rec is not None
        client = AgentClient(rec.agent_addr, rec.token)
        try:
            assert client.ping()["epoch"] == epoch  # nobody was fenced
        finally:
            client.close()
    finally:
        monkeypatch.setattr(_registry, "write", real_write)
        rec = _registry.read(name)
        if rec is not None:
            stop_record(rec)


def test_a_write_that_fails_says_which_folder_and_what_to_do(state_home, monkeypatch):
    from monarch_kernel import errors
    from monarch_kernel.hosts._registry import MeshRecord

    rec = MeshRecord(
        name="x",
        token="t",
        agent_addr="a",
        agent_pid=1,
        host="h",
        spec={"per_host": {}},
        idle_timeout=0.0,
        ephemeral=True,
    )

    def no_space(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_registry.os, "open", no_space)
    with pytest.raises(errors.MeshStateError, match="No space left on device") as info:
        _registry.write(rec)
    assert str(_registry.meshes_dir()) in str(info.value) and "XDG_STATE_HOME" in str(info.value)


# A controller in a state folder it cannot write: each spawn (named, then unnamed)
# and ls say what happened, as "CLASS | message" lines.
_IN_A_FOLDER_NOT_WRITABLE = """
import sys
from monarch_kernel import this_host
from monarch_kernel.cli import main
for name in (sys.argv[1], None):
    try:
        this_host().spawn_procs(per_host={"procs": 1}, name=name)
    except Exception as e:
        print(type(e).__name__, "|", str(e).replace(chr(10), " "), flush=True)
    else:
        print("STARTED |", flush=True)
print("LS |", main(["ls"]), flush=True)
"""


def _as_a_user(argv: list[str]) -> list[str]:
    """``argv`` with folders' modes applying to it: as root, without the capabilities
    that override them (root still owns its own files, the interpreter's included)."""
    if os.geteuid() != 0:
        return argv
    drop = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", "--", *argv]


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="needs setpriv as root")
@pytest.mark.parametrize("read_only", ["state home", "meshes folder"])
def test_a_spawn_in_a_state_folder_that_cannot_be_written_is_a_mesh_state_error_naming_it(
    tmp_path, read_only
):
    home = tmp_path / "state"
    meshes = home / "monarch-kernel" / "meshes"
    meshes.mkdir(parents=True)
    folder = home if read_only == "state home" else meshes
    if read_only == "state home":
        shutil.rmtree(home / "monarch-kernel")  # nothing made yet: the first spawn makes it
    folder.chmod(0o500)
    try:
        done = subprocess.run(
            _as_a_user([sys.executable, "-c", _IN_A_FOLDER_NOT_WRITABLE, _name()]),
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "XDG_STATE_HOME": str(home)},
        )
    finally:
        folder.chmod(0o700)
    said = [ln.split(" | ", 1) for ln in done.stdout.splitlines() if " | " in ln]
    assert len(said) == 3, done.stdout + done.stderr
    (named_kind, named), (anon_kind, anon), (_ls, ls_status) = said
    for kind, text in ((named_kind, named), (anon_kind, anon)):
        assert kind == "MeshStateError", f"{kind}: {text}"
        assert str(home) in text and "XDG_STATE_HOME" in text, text
    assert ls_status == "0" and "no running meshes" in done.stdout, done.stdout + done.stderr
