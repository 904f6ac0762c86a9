"""The meshes panel's server extension (issue 18, its server side) in pytest-jupyter's
in-process Jupyter server, enabled by the config ``monarch-kernel install`` writes:
the list of meshes with their procs, logs, stacks and down, under the server's
authentication (a request without the token is refused), and SERVER-1: a name that
is not a mesh name is refused and never used as a path."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse

import psutil
import pytest
from proc_helpers import mesh_of_another_host
from tornado.httpclient import HTTPClientError
from view_schema import valid_view

from monarch_kernel.hosts import _registry

#: Not mesh names (None: the way from the state folder to a file outside it).
NOT_NAMES: dict[str, str | None] = {
    "dotdot": "..",
    "slash": "a/b",
    "300-chars": "x" * 300,
    "empty": "",
    "path-out-of-the-state-folder": None,
}


async def _json(jp_fetch, *parts: str, method: str = "GET", **kwargs) -> dict:
    body = b"" if method == "POST" else None
    response = await jp_fetch(*parts, method=method, body=body, request_timeout=60, **kwargs)
    assert response.code == 200
    return json.loads(response.body)


async def _meshes(jp_fetch) -> dict[str, dict]:
    return {m["name"]: valid_view(m) for m in (await _json(jp_fetch, "monarch", "meshes"))["meshes"]}


async def test_the_list_of_meshes_is_json_with_a_meshes_list(jp_fetch):
    assert isinstance((await _json(jp_fetch, "monarch", "meshes"))["meshes"], list)


async def test_a_mesh_started_from_a_script_is_listed_with_its_procs(jp_fetch, script_mesh):
    m = (await _meshes(jp_fetch))[script_mesh]
    assert m["name"] == script_mesh and m["procs"] == 2
    assert [r["rank"] for r in m["ranks"]] == [0, 1]
    pids = [r["pid"] for r in m["ranks"]]
    assert len(set(pids)) == 2
    assert all("monarch_kernel.worker" in " ".join(psutil.Process(pid).cmdline()) for pid in pids)


async def test_each_rank_of_a_running_mesh_is_alive_with_its_cpu_and_memory(jp_fetch, script_mesh):
    m = (await _meshes(jp_fetch))[script_mesh]
    assert m["state"] == "alive" and m["alive"] == 2
    assert all(r["state"] == "alive" for r in m["ranks"])
    assert m["attached"] is False  # the script that made it has gone
    # each worker's CPU and memory, measured on its host (the inspector's figures)
    assert all(r["usage"]["rss"] > 0 and r["usage"]["cpu"] >= 0 for r in m["ranks"])


async def test_logs_of_a_mesh_come_labelled_with_their_rank(jp_fetch, script_mesh):
    logs = await _json(jp_fetch, "monarch", "meshes", script_mesh, "logs", params={"tail": "50"})
    assert logs["mesh"] == script_mesh
    said = [line for line in logs["lines"] if "said from the script" in line]
    assert sorted(said) == ["[rank 0] said from the script", "[rank 1] said from the script"]
    one = await _json(jp_fetch, "monarch", "meshes", script_mesh, "logs", params={"rank": "1"})
    assert one["lines"] and all(line.startswith("[rank 1] ") for line in one["lines"])


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"rank": "x"}, "rank must be a whole number of at least 0, not 'x'"),
        ({"rank": "-1"}, "rank must be a whole number"),
        ({"rank": "2"}, "has no rank 2"),
        ({"tail": "0"}, "tail must be a whole number of at least 1"),
        ({"tail": "99999999999999999999"}, "tail must be a whole number from 1 to 4294967295"),
        ({"tail": "4294967296"}, "tail must be a whole number from 1 to 4294967295"),
        ({"tail": "1e3"}, "tail must be a whole number"),
        ({"rank": "99999999999999999999"}, "has no rank 99999999999999999999"),
    ],
)
async def test_a_bad_rank_or_tail_for_logs_is_a_400_that_says_why(jp_fetch, script_mesh, params, says):
    with pytest.raises(HTTPClientError) as bad:
        await jp_fetch("monarch", "meshes", script_mesh, "logs", params=params)
    assert bad.value.code == 400
    assert says in json.loads(bad.value.response.body)["message"]


async def test_stacks_say_what_each_worker_runs(jp_fetch, script_mesh):
    ranks = (await _json(jp_fetch, "monarch", "meshes", script_mesh, "stacks"))["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all("Thread" in r["stacks"] for r in ranks)


async def test_down_stops_the_mesh_and_it_leaves_the_list(jp_fetch, script_mesh):
    workers = [psutil.Process(r["pid"]) for r in (await _meshes(jp_fetch))[script_mesh]["ranks"]]
    down = await _json(jp_fetch, "monarch", "meshes", script_mesh, "down", method="POST")
    assert down["mesh"] == script_mesh and "stopped" in down["result"]
    assert script_mesh not in await _meshes(jp_fetch)
    _gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, f"workers of {script_mesh} still run after down: {alive}"


async def test_a_mesh_this_server_cannot_reach_is_listed_unreachable_with_its_host_and_kept(jp_fetch):
    # REGISTRY-3: a look from a server on another host (login node, namespace) never
    # removes a mesh's state file; its actions say where the mesh runs (503).
    with mesh_of_another_host() as (name, _sleeper):
        m = (await _meshes(jp_fetch))[name]
        assert m["state"] == "unreachable" and m["procs"] == 2 and m["ranks"] == []
        assert [h["host"] for h in m["hosts"]] == ["login"] and m["hosts"][0]["state"] == "unreachable"
        assert "cannot be reached from here" in m["why"] and f"monarch-kernel down {name}" in m["why"]
        for path, method in (("logs", "GET"), ("stacks", "GET"), ("respawn", "POST"), ("down", "POST")):
            with pytest.raises(HTTPClientError) as far:
                await jp_fetch(
                    "monarch", "meshes", name, path, method=method, body=b"" if method == "POST" else None
                )
            assert far.value.code == 503, path
            assert "login" in json.loads(far.value.response.body)["message"], path
        assert _registry.read(name) is not None


@pytest.mark.parametrize("path", ["logs", "stacks"])
async def test_logs_or_stacks_of_an_unknown_mesh_are_a_404_that_names_it(jp_fetch, path):
    with pytest.raises(HTTPClientError) as missing:
        await jp_fetch("monarch", "meshes", "no-such-mesh", path)
    assert missing.value.code == 404
    assert "no-such-mesh" in json.loads(missing.value.response.body)["message"]


async def test_down_of_an_unknown_mesh_is_a_404_that_names_it(jp_fetch):
    with pytest.raises(HTTPClientError) as missing:
        await jp_fetch("monarch", "meshes", "no-such-mesh", "down", method="POST", body=b"")
    assert missing.value.code == 404
    assert "no-such-mesh" in json.loads(missing.value.response.body)["message"]


async def _raw(http_server_client, jp_base_url, jp_auth_header, path: str, method: str = "GET"):
    """``path`` sent as it is (``jp_fetch`` would escape a ``%``), with the token."""
    return await http_server_client.fetch(
        jp_base_url + path,
        method=method,
        body=b"" if method == "POST" else None,
        headers=jp_auth_header,
        raise_error=False,
        request_timeout=60,
    )


@pytest.mark.parametrize("name", list(NOT_NAMES))
@pytest.mark.parametrize("action", ["GET logs", "GET stacks", "POST down"])
async def test_a_name_that_is_not_a_mesh_name_is_refused_and_no_file_is_touched(
    http_server_client, jp_base_url, jp_auth_header, tmp_path, name, action
):
    # A state file outside the state folder, where a name taken as a path would lead;
    # corrupt, so that reading it as a mesh's would remove it (REGISTRY-1).
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "decoy.json").write_text("{not json")
    text = NOT_NAMES[name]
    if text is None:
        text = os.path.relpath(outside / "decoy", _registry.meshes_dir())
    method, what = action.split()
    quoted = urllib.parse.quote(text, safe="")  # a slash as %2F: still one path segment
    response = await _raw(
        http_server_client, jp_base_url, jp_auth_header, f"monarch/meshes/{quoted}/{what}", method
    )
    assert response.code in (400, 404)
    assert [p.name for p in outside.iterdir()] == ["decoy.json"]
    assert (outside / "decoy.json").read_text() == "{not json"


async def test_a_name_that_is_not_a_mesh_name_says_what_a_name_is(
    http_server_client, jp_base_url, jp_auth_header
):
    response = await _raw(http_server_client, jp_base_url, jp_auth_header, "monarch/meshes/a%2Fb/logs")
    assert response.code == 400
    assert "letters, digits" in json.loads(response.body)["message"]


@pytest.mark.parametrize("path", ["meshes", "events", "meshes/x/logs", "meshes/x/stacks"])
async def test_a_request_without_the_token_is_refused(http_server_client, jp_base_url, path):
    response = await http_server_client.fetch(
        jp_base_url + "monarch/" + path, raise_error=False, request_timeout=30
    )
    assert response.code == 403


async def test_a_post_without_the_token_or_xsrf_is_refused_and_the_mesh_keeps_running(
    jp_fetch, http_server_client, jp_base_url, script_mesh
):
    response = await http_server_client.fetch(
        f"{jp_base_url}monarch/meshes/{script_mesh}/down",
        method="POST",
        body=b"",
        raise_error=False,
        request_timeout=30,
    )
    assert response.code == 403
    assert script_mesh in await _meshes(jp_fetch)


async def test_every_listener_of_the_events_shares_one_look_at_the_meshes(
    jp_serverapp, http_server_client, jp_base_url, jp_auth_header, script_mesh, monkeypatch
):
    # However many tabs listen, the workers are asked once per look, not once per tab.
    from monarch_kernel.server import _handlers

    looks: list[int] = []
    real = _handlers.meshes_view
    monkeypatch.setattr(_handlers, "meshes_view", lambda: looks.append(1) or real())
    monkeypatch.setattr(_handlers, "EVERY_S", 3600.0)  # one look, then none for the test's life
    got: list[asyncio.Queue[bytes]] = [asyncio.Queue() for _ in range(3)]
    streams = [
        asyncio.ensure_future(
            http_server_client.fetch(
                jp_base_url + "monarch/events",
                headers=jp_auth_header,
                streaming_callback=q.put_nowait,
                request_timeout=3600,
            )
        )
        for q in got
    ]
    try:
        firsts = [await asyncio.wait_for(q.get(), 60) for q in got]
        assert all(f.startswith(b"data: ") for f in firsts) and len(set(firsts)) == 1
        assert script_mesh in [m["name"] for m in json.loads(firsts[0][len(b"data: ") :])["meshes"]]
        assert len(looks) == 1, f"{len(looks)} looks for 3 listeners"
        looker = jp_serverapp.web_app.settings["monarch_looker"]
        assert looker.listeners == 3
    finally:
        for s in streams:
            s.cancel()
        task = jp_serverapp.web_app.settings["monarch_looker"].task
        if task is not None:
            task.cancel()
