"""``monarch-kernel down``: stopping meshes as an administrator, with real agents.
``--all`` asks first (and, where no one can answer, stops nothing without --yes),
and leaves meshes another controller is attached to unless --force."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from monarch_kernel.hosts import _registry


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monarch_kernel", *args], capture_output=True, text=True, timeout=60
    )


def _detached_mesh() -> str:
    """A named mesh whose controller (a script) has exited: nobody is attached."""
    name = f"down-{uuid.uuid4().hex[:6]}"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from monarch_kernel import this_host; this_host().spawn_procs(per_host={{'procs': 1}}, name={name!r})",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return name


@pytest.mark.slow
def test_down_all_stops_nothing_unasked_where_no_one_can_answer(state_home):
    name = _detached_mesh()
    try:
        out = _cli("down", "--all")  # stdin is not a terminal here
        assert out.returncode == 2, out
        assert "nothing stopped" in out.stderr and name in out.stderr and "--yes" in out.stderr
        assert name in _cli("ls").stdout
        out = _cli("down", "--all", "--yes")
        assert out.returncode == 0 and f"stopped {name}" in out.stdout
        assert _registry.read(name) is None
    finally:
        if _registry.read(name) is not None:
            _cli("down", name)
