"""A look never deletes a live mesh (REGISTRY-3): ``monarch-kernel ls``, ``attach``
and get-or-create run where a mesh's agent does not answer (another network
namespace sharing this home: another login node, a container) keep its state file,
say the mesh is unreachable from here with its host, and never make a second mesh
of its name.

"Elsewhere" is a real one: ``unshare --net`` gives a process a network namespace of
its own, whose loopback is not the agent's (down, or up with nothing listening: a
refused connection there says nothing of the agent), with this machine's hostname or
another one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import jupyter_servers
import pytest
from proc_helpers import mesh_of_another_host

from monarch_kernel import attach, list_meshes, this_host
from monarch_kernel.controller import down, mesh_table
from monarch_kernel.errors import MeshUnreachableError
from monarch_kernel.hosts import _registry

#: Where the agent does not answer: a network namespace whose loopback is down (this
#: hostname), and one whose loopback is up, refusing, on another hostname (another
#: login node that shares the home).
ELSEWHERE = {
    "netns-loopback-down": 'exec "$@"',
    "other-login-node": 'ip link set lo up && hostname other-login && exec "$@"',
}


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    done = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"unshare --net --uts fails here: {done.stderr.strip()}"


needs_unshare = pytest.mark.skipif(bool(_can_unshare()), reason=str(_can_unshare()))


def _elsewhere(where: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run in a network namespace of its own (see ``ELSEWHERE``)."""
    return subprocess.run(
        ["unshare", "--net", "--uts", "--", "sh", "-c", ELSEWHERE[where], "sh", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MONARCH_FORWARD_OUTPUT": "0"},
    )


@pytest.fixture
def far_mesh(state_home: Path, tmp_path: Path) -> Iterator[str]:
    """A named mesh of 2 procs started by a script (which exits), on this host."""
    with jupyter_servers.script_mesh(tmp_path, prefix="far") as name:
        yield name


@needs_unshare
@pytest.mark.parametrize("where", list(ELSEWHERE))
def test_ls_where_the_agent_does_not_answer_keeps_the_mesh_and_says_unreachable(far_mesh, where):
    path = _registry.path_of(far_mesh)
    before = path.stat().st_ino  # (the agent puts a removed file back: a new one)
    out = _elsewhere(where, [sys.executable, "-m", "monarch_kernel", "ls"])
    assert out.returncode == 0, out.stderr
    assert path.stat().st_ino == before, "the state file was removed (and put back by its agent)"
    assert "is gone" not in out.stderr, out.stderr
    row = next((ln for ln in out.stdout.splitlines() if ln.startswith(far_mesh)), None)
    assert row is not None, f"ls does not list {far_mesh}:\n{out.stdout}{out.stderr}"
    assert "unreachable from here" in row and os.uname().nodename in row, row
    # From here it is alive as ever.
    here = subprocess.run(
        [sys.executable, "-m", "monarch_kernel", "ls"], capture_output=True, text=True, timeout=60
    )
    row = next(ln for ln in here.stdout.splitlines() if ln.startswith(far_mesh))
    assert row.split()[1:3] == ["2", "2"], row


ATTACH_AND_SPAWN = textwrap.dedent(
    """
    import sys
    from monarch_kernel import attach, this_host
    name = sys.argv[1]
    for what, make in (
        ("ATTACH", lambda: attach(name)),
        ("SPAWN", lambda: this_host().spawn_procs(per_host={"procs": 2}, name=name)),
    ):
        try:
            procs = make()
        except Exception as e:
            print(what, type(e).__name__, str(e).replace(chr(10), " "), flush=True)
        else:
            print(what, "MADE", flush=True)
            procs.stop()
    """
)


@needs_unshare
@pytest.mark.parametrize("where", list(ELSEWHERE))
def test_attach_and_spawn_where_the_agent_does_not_answer_say_where_it_runs_and_make_no_second_mesh(
    far_mesh, where
):
    path = _registry.path_of(far_mesh)
    before = (path.stat().st_ino, _registry.read(far_mesh).token)
    out = _elsewhere(where, [sys.executable, "-c", ATTACH_AND_SPAWN, far_mesh])
    said = dict(ln.split(" ", 1) for ln in out.stdout.splitlines() if ln.startswith(("ATTACH", "SPAWN")))
    assert set(said) == {"ATTACH", "SPAWN"}, out.stdout + out.stderr
    for what, text in said.items():
        assert text.startswith("MeshUnreachableError "), f"{what}: {text}"
        assert far_mesh in text and os.uname().nodename in text, f"{what}: {text}"
        assert f"monarch-kernel down {far_mesh}" in text, f"{what}: {text}"
    assert (path.stat().st_ino, _registry.read(far_mesh).token) == before


@pytest.fixture
def other_hosts_mesh(state_home: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with mesh_of_another_host() as made:
        yield made


def test_a_mesh_of_another_host_is_kept_listed_unreachable_and_never_downed_or_duplicated_from_here(
    other_hosts_mesh,
):
    name, sleeper = other_hosts_mesh
    info = {m.name: m for m in list_meshes()}[name]
    assert info.unreachable is not None and "login" in info.unreachable and info.procs == 2
    row = next(ln for ln in mesh_table() if ln.startswith(name))
    assert "login unreachable from here" in row, row
    ((ok, said),) = down([name])
    assert not ok and "cannot be reached from here" in said and "login" in said, said
    with pytest.raises(MeshUnreachableError, match="login"):
        attach(name)
    with pytest.raises(MeshUnreachableError, match=f"monarch-kernel down {name}"):
        this_host().spawn_procs(per_host={"procs": 2}, name=name)
    with pytest.raises(MeshUnreachableError):
        this_host().spawn_procs(per_host={"procs": 1}, name=name, replace=True)
    assert _registry.read(name) is not None and _registry.read(name).host == "login"
    assert sleeper.poll() is None  # a pid here is not that host's agent: never signalled
