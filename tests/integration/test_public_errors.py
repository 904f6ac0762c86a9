"""Public calls raise only documented errors (``monarch_kernel.errors``), each saying
what happened and the next step, with real agents: a state file whose token the
running agent refuses, an agent that runs but does not answer, a host whose sshd
refuses."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys

import pytest
from proc_helpers import sigstop, wait_for

from monarch_kernel import attach, errors, list_meshes
from monarch_kernel.hosts import _registry


@pytest.fixture
def named(named_mesh):
    return named_mesh(1, "err")


def test_a_state_file_the_running_agent_refuses_is_a_mesh_auth_error_naming_the_file(named):
    name, procs = named
    procs._session("test").detach()  # another process's mesh, as far as this one knows
    rec = _registry.read(name)
    assert rec is not None
    _registry.write(dataclasses.replace(rec, token="a-token-the-agent-never-had"))
    with pytest.raises(errors.MeshAuthError) as info:
        attach(name)
    text = str(info.value)
    assert str(_registry.path_of(name)) in text
    assert f"monarch-kernel down {name}" in text
    assert "does not answer" not in text  # it answered: it refused the token
    with pytest.warns(_registry.MeshStateWarning):
        assert name not in [m.name for m in list_meshes()]
    # The next step the message names works: down stops the agent.
    out = subprocess.run(
        [sys.executable, "-m", "monarch_kernel", "down", name], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert wait_for(lambda: not os.path.exists(f"/proc/{rec.agent_pid}") or _zombie(rec.agent_pid))


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_an_agent_that_does_not_answer_is_a_documented_error_and_attach_works_after_sigcont(named):
    name, procs = named
    procs._session("test").detach()
    rec = _registry.read(name)
    assert rec is not None
    sigstop(rec.agent_pid)
    try:
        with pytest.raises(errors.AgentUnresponsiveError) as info:
            attach(name)
        assert isinstance(info.value, errors.MonarchKernelError)
        assert "SIGCONT" in str(info.value) and f"monarch-kernel down {name}" in str(info.value)
    finally:
        os.kill(rec.agent_pid, signal.SIGCONT)
    again = attach(name)
    assert again.status() == ["alive"]


def test_a_host_whose_sshd_refuses_is_a_mesh_start_error_naming_it(state_home):
    from monarch_kernel.job import SSHJob

    with socket.socket() as s:  # a loopback port where no sshd listens: refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hosts = SSHJob(hosts=["127.0.0.1"], ssh_args=["-p", str(port), "-o", "ConnectTimeout=10"])
    with pytest.raises(errors.MeshStartError) as info:
        hosts.state(cached_path=None).hosts.spawn_procs(per_host={"procs": 1})
    assert not isinstance(info.value, errors.SupervisionError)  # nothing was running to fail
    text = str(info.value)
    assert "ssh 127.0.0.1" in text and "refused" in text, text
    assert info.value.host == "127.0.0.1"
    assert not _registry.names()
