"""Workspace sync to SSH hosts that do not share the notebook's folder: the
controller's folder is a private tmpfs mount of its own process (the hosts see an
empty folder there), so a module in it reaches the workers only through
``sync_workspace``; edited between two calls, it is sent again and reloaded."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from cluster_checks import down_all
from controller import Controller, ControllerError, private_mount

from tools.testcluster import Cluster

#: Runs the controller in a private tmpfs mounted on its folder ($0): nothing it
#: writes there is visible to any other process, the hosts' workers included.
PRIVATE = private_mount('mount -t tmpfs tmpfs "$0" && cd "$0" && exec "$@"')

USES = """
import os, time
from monarch_kernel import Actor, attach, endpoint
from monarch_kernel.job import SSHJob

class Uses(Actor):
    @endpoint
    def value(self):
        import helpers
        return [helpers.VALUE, helpers.__file__]

    @endpoint
    def pid(self):
        return os.getpid()
"""


def test_a_local_module_edited_between_two_calls_reaches_ssh_hosts_through_sync(
    cluster: Cluster, tmp_path: Path
):
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    state_home = tmp_path / "state"
    c = Controller(cluster, str(state_home), prefix=[*PRIVATE, str(notebook)])
    try:
        c.run(USES)
        c.run("open('helpers.py', 'w').write('VALUE = 1\\n')")
        assert not (notebook / "helpers.py").exists()  # the notebook's folder is its own
        hosts = f"SSHJob(hosts=['h1', 'h2'], ssh_args=['-F', {str(cluster.ssh_config)!r}]).state(cached_path=None)"
        c.run(f"procs = {hosts}.hosts.spawn_procs(per_host={{'procs': 1}}, name='ws')")
        c.run("u = procs.spawn('uses', Uses)")
        with pytest.raises(ControllerError, match="No module named 'helpers'"):
            c.eval("u.value.call().get(timeout=60)")
        assert (
            c.eval("repr(procs.sync_workspace().get())")
            == "synced 1 changed file (10 B) to 2 hosts; 0 unchanged"
        )
        first = c.eval("u.value.call().get(timeout=60).values()")
        assert [v for v, _ in first] == [1, 1]
        assert [Path(f).parent.name for _, f in first] == ["ws@h1", "ws@h2"]  # each host's own copy
        c.run("open('helpers.py', 'w').write('VALUE = 2\\n')")
        again = c.eval("repr(procs.sync_workspace(auto_reload=True).get())")
        assert again == "synced 1 changed file (10 B) to 2 hosts; 0 unchanged; reloaded helpers (ranks 0-1)"
        assert [v for v, _ in c.eval("u.value.call().get(timeout=60).values()")] == [2, 2]
        victim = c.eval("u.pid.call().get(timeout=60).values()")[1]
        c.close()  # the mesh is named: it outlives its controller
        # A new controller (which never synced) respawns a rank: it imports from its
        # host's copy again, as the last sync of this mesh there said.
        c = Controller(cluster, str(state_home), prefix=[*PRIVATE, str(notebook)])
        c.run(USES)
        c.run("procs = attach('ws')")
        os.kill(victim, signal.SIGKILL)  # (the test hosts share this machine's pids)
        c.run(
            "deadline = time.time() + 30\nwhile procs.status()[1] != 'dead' and time.time() < deadline: time.sleep(0.05)"
        )
        assert c.eval("procs.respawn()") == [1]
        assert [v for v, _ in c.eval("procs.spawn('uses2', Uses).value.call().get(timeout=60).values()")] == [
            2,
            2,
        ]
        c.run("procs.stop()")
    finally:
        c.close()
        down_all(cluster, state_home)
