"""Workspace sync on this host (``ProcMesh.sync_workspace``): what is sent and what
is not, removed files, a destination folder, a respawned rank importing from the
copy again, and bad input refused with the reason. Across hosts that do not share
the notebook's folder: tests/multihost/test_workspace_ssh.py and tests/k8s."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from monarch_kernel import Actor, endpoint, this_host
from monarch_kernel.controller import _workspace
from monarch_kernel.errors import MeshSpecError


class Importer(Actor):
    @endpoint
    def load(self, module: str) -> list:
        import importlib

        m = importlib.import_module(module)
        return [m.VALUE, m.__file__, os.getpid()]


@pytest.fixture
def procs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    made = this_host().spawn_procs(per_host={"procs": 2})
    yield made
    made.stop()


def test_only_changes_are_sent_and_removed_files_go(procs, tmp_path, monkeypatch):
    code = tmp_path / "proj"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "__init__.py").write_text("")
    (code / "wsmod_a.py").write_text("VALUE = 'a'\n")
    (code / "gone_soon.py").write_text("VALUE = 0\n")
    (code / ".git").mkdir()
    (code / ".git" / "HEAD").write_text("ref: x\n")  # hidden folders are not sent
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (code / "big.bin").write_bytes(b"\0" * 2048)
    monkeypatch.setattr(_workspace, "MAX_FILE_BYTES", 1024)
    first = procs.sync_workspace({str(code): "src"}).get()
    assert (first.files, first.hosts, first.unchanged) == (3, 1, 0)
    assert first.skipped == [str(code / "big.bin")]
    where = procs.spawn("imp", Importer).load.call("wsmod_a").get().values()
    copy = Path(where[0][1]).parent
    assert copy.name == "src" and [v for v, _, _ in where] == ["a", "a"]
    assert sorted(p.name for p in copy.iterdir() if p.name != "__pycache__") == [
        "gone_soon.py",
        "pkg",
        "wsmod_a.py",
    ]
    (code / "gone_soon.py").unlink()
    again = procs.sync_workspace({str(code): "src"}).get()
    assert (again.files, again.removed, again.unchanged) == (0, 1, 2)
    assert not (copy / "gone_soon.py").exists()


def test_a_respawned_rank_imports_from_the_workspace_again(procs, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "wsmod_b.py").write_text("VALUE = 'b'\n")
    procs.sync_workspace(str(code)).get()
    imp = procs.spawn("imp", Importer)
    pid = imp.load.call("wsmod_b").get().values()[1][2]
    os.kill(pid, signal.SIGKILL)
    import time

    deadline = time.monotonic() + 30
    while procs.status()[1] != "dead":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert procs.respawn() == [1]
    values = imp.load.call("wsmod_b").get().values()
    assert [v for v, _, _ in values] == ["b", "b"] and values[1][2] != pid


def test_bad_workspaces_are_refused_with_the_reason(procs, tmp_path):
    with pytest.raises(MeshSpecError, match="is not a folder here"):
        procs.sync_workspace(str(tmp_path / "nope"))
    with pytest.raises(MeshSpecError, match="must be a relative path"):
        procs.sync_workspace({str(tmp_path): "/etc"})
    with pytest.raises(MeshSpecError, match="conda=True"):
        procs.sync_workspace(conda=True)
    with pytest.raises(MeshSpecError, match="give a folder"):
        procs.sync_workspace(42)
