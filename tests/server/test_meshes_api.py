"""The meshes panel's server extension (issue 18, its server side) in a real Jupyter
server started from this venv, enabled by the config file ``monarch-kernel install``
writes, over HTTP with the server's token: a worker killed from outside shows as dead
in the events stream within a second; respawn, of a mesh nobody holds and of one a
process other than the server holds. (The other handlers, in pytest-jupyter's
in-process server: test_handlers.py.)"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jupyter_servers
import pytest

from monarch_kernel.kernel._install import enable_server_extension


@pytest.fixture(scope="module")
def server(state_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A Jupyter server with the extension enabled through its config: (URL, token)."""
    config = tmp_path_factory.mktemp("server-config")
    enable_server_extension(prefix=str(config))  # (writes etc/jupyter/... under it)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_PATH=str(config / "etc" / "jupyter"),
        JUPYTER_RUNTIME_DIR=str(config / "runtime"),
    )
    with jupyter_servers.jupyter_server("jupyter_server", config, env) as served:
        yield served


def _get(server: tuple[str, str], path: str) -> dict:
    url, token = server
    req = urllib.request.Request(f"{url}{path}", headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def _post(server: tuple[str, str], path: str) -> dict:
    url, token = server
    req = urllib.request.Request(
        f"{url}{path}", data=b"", method="POST", headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def test_a_killed_worker_shows_dead_in_the_events_stream_within_a_second(server, script_mesh):
    url, token = server
    stream = urllib.request.urlopen(
        urllib.request.Request(f"{url}/monarch/events", headers={"Authorization": f"token {token}"}),
        timeout=30,
    )

    def next_event() -> dict:
        for raw in stream:
            line = raw.decode().strip()
            if line.startswith("data: "):
                return json.loads(line[len("data: ") :])
        raise AssertionError("the events stream ended")

    first = {m["name"]: m for m in next_event()["meshes"]}[script_mesh]
    pid = first["ranks"][1]["pid"]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    while True:
        m = {x["name"]: x for x in next_event()["meshes"]}.get(script_mesh)
        if m is not None and m["ranks"][1]["state"] != "alive":
            break
    seen = time.monotonic() - killed
    stream.close()
    assert m["state"] == "degraded" and m["alive"] == 1
    assert (m["ranks"][1]["state"], m["ranks"][1]["why"]) == ("dead", "SIGKILL")
    # (the stream's read times out at 30 s)
    print(f"the events stream said rank 1 dead {seen:.2f} s after kill -9")


def test_respawn_restarts_a_dead_rank_of_a_mesh_nobody_holds(server, script_mesh):
    m = {x["name"]: x for x in _get(server, "/monarch/meshes")["meshes"]}[script_mesh]
    os.kill(m["ranks"][1]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 15
    while m["ranks"][1]["state"] != "dead" and time.monotonic() < deadline:
        m = {x["name"]: x for x in _get(server, "/monarch/meshes")["meshes"]}[script_mesh]
    assert _post(server, f"/monarch/meshes/{script_mesh}/respawn") == {
        "mesh": script_mesh,
        "ranks": [1],
        "via": "administrator",
    }
    m = {x["name"]: x for x in _get(server, "/monarch/meshes")["meshes"]}[script_mesh]
    assert [r["state"] for r in m["ranks"]] == ["alive", "alive"] and m["ranks"][1]["restarts"] == 1


def test_respawn_of_a_mesh_held_outside_the_server_is_refused_naming_the_holder(server, state_home):
    from monarch_kernel import this_host

    name = f"held-{os.getpid()}"
    procs = this_host().spawn_procs(per_host={"procs": 1}, name=name)
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            _post(server, f"/monarch/meshes/{name}/respawn")
        assert refused.value.code == 409
        message = json.load(refused.value)["message"]
        assert f"is held by pid {os.getpid()} on" in message and "procs.respawn()" in message
        assert f"or %mesh respawn {name})" in message and "%%" not in message  # as written
        with pytest.raises(urllib.error.HTTPError) as missing:
            _post(server, "/monarch/meshes/no-such-mesh/respawn")
        assert missing.value.code == 404
    finally:
        procs.stop()
