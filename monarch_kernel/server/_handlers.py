"""HTTP handlers of the server extension (see the package docstring)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import tornado.iostream
import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from monarch_kernel.controller._admin import ask_workers
from monarch_kernel.errors import MeshSpecError, MonarchKernelError
from monarch_kernel.hosts import _admin, _registry

#: How often the events stream looks at the agents while someone listens.
EVERY_S = 0.5
#: How long a snapshot waits for the workers' CPU/memory/GPU figures.
USAGE_WAIT_S = 0.3


def snapshot() -> list[dict[str, Any]]:
    """Every running mesh of this user, with its procs: the panel's one source."""
    out = []
    now = time.time()
    for m in _admin.list_meshes():
        procs: list[dict[str, Any]] = []
        rec = _registry.read(m.name)
        client = _admin.connect(rec) if rec is not None else None
        if client is not None and rec is not None:
            try:
                workers = client.list_workers()
            except MonarchKernelError:
                workers = []
            finally:
                client.close()
            live = [w for w in workers if w["state"] == "running"]
            usage = dict(zip((w["rank"] for w in live), ask_workers(rec, live, "usage", USAGE_WAIT_S)))
            keep = ("rank", "pid", "host", "state", "exit_code", "signal_name", "restarts")
            procs = [
                # usage: measured by the worker on its own host (INSPECT-2)
                {**{k: w[k] for k in keep}, "usage": usage.get(w["rank"])}
                for w in workers
            ]
        gone = [h["host"] for h in m.hosts if h["state"] != "alive"]
        state = (
            "lost"
            if m.hosts and len(gone) == len(m.hosts)
            else "alive"
            if m.alive == m.procs and not gone
            else "degraded"
        )
        out.append(
            {
                "name": m.name,
                "state": state,
                "procs": m.procs,
                "alive": m.alive,
                "hosts": m.hosts,
                "epoch": m.owner_epoch,
                "attached": m.attached,
                "ephemeral": m.ephemeral,
                "idle_timeout": m.idle_timeout,
                "age": now - m.created,
                "ranks": sorted(procs, key=lambda p: p["rank"]),
            }
        )
    return out


def _name(name: str) -> str:
    """SERVER-1: ``name`` as a mesh name, or a 400 that says why."""
    try:
        _registry.check_name(name)
    except MeshSpecError as e:
        raise tornado.web.HTTPError(400, str(e)) from None
    return name


class MeshesHandler(APIHandler):  # type: ignore[misc]
    @tornado.web.authenticated
    async def get(self) -> None:
        meshes = await asyncio.get_running_loop().run_in_executor(None, snapshot)
        self.finish(json.dumps({"meshes": meshes}))


class EventsHandler(APIHandler):  # type: ignore[misc]
    """Server-sent events: the snapshot each time it changes."""

    @tornado.web.authenticated
    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        last = None
        loop = asyncio.get_running_loop()
        try:
            while True:
                meshes = await loop.run_in_executor(None, snapshot)
                text = json.dumps({"meshes": meshes}, sort_keys=True)
                if text != last:
                    last = text
                    self.write(f"data: {text}\n\n")
                    await self.flush()
                await asyncio.sleep(EVERY_S)
        except tornado.iostream.StreamClosedError:
            return  # the browser went away


_MISSING = object()


async def _with_mesh(name: str, work: Callable[[Any, Any], Any]) -> Any:
    """``work(record, agents)`` for the running mesh ``name`` (off the event loop); a
    404 that says so when it is not running."""

    def run() -> Any:
        rec = _registry.read(name)
        client = _admin.connect(rec) if rec is not None else None
        if rec is None or client is None:
            return _MISSING
        try:
            return work(rec, client)
        finally:
            client.close()

    out = await asyncio.get_running_loop().run_in_executor(None, run)
    if out is _MISSING:
        raise tornado.web.HTTPError(404, f"no mesh named {name!r} is running")
    return out


class LogsHandler(APIHandler):  # type: ignore[misc]
    @tornado.web.authenticated
    async def get(self, name: str) -> None:
        name = _name(name)
        rank = self.get_query_argument("rank", None)
        tail = int(self.get_query_argument("tail", "100"))
        lines = await _with_mesh(
            name, lambda _rec, agents: list(agents.logs(rank=int(rank) if rank else None, tail=tail))
        )
        self.finish(json.dumps({"mesh": name, "lines": lines}))


class StacksHandler(APIHandler):  # type: ignore[misc]
    """What each running worker of a mesh runs now (its Python stacks)."""

    @tornado.web.authenticated
    async def get(self, name: str) -> None:
        name = _name(name)

        def read(rec: Any, agents: Any) -> list[dict[str, Any]]:
            live = [w for w in agents.list_workers() if w["state"] == "running"]
            stacks = ask_workers(rec, live, "stacks", 10.0)
            return [{"rank": w["rank"], "stacks": s or "(no answer)"} for w, s in zip(live, stacks)]

        self.finish(json.dumps({"mesh": name, "ranks": await _with_mesh(name, read)}))


class DownHandler(APIHandler):  # type: ignore[misc]
    @tornado.web.authenticated
    async def post(self, name: str) -> None:
        name = _name(name)
        from monarch_kernel.controller import down

        ((ok, what),) = await asyncio.get_running_loop().run_in_executor(None, down, [name])
        if not ok:
            raise tornado.web.HTTPError(404, what)
        self.finish(json.dumps({"mesh": name, "result": what}))


def handlers(base: str) -> list[tuple[str, Any]]:
    """The routes, under the server's base URL."""
    name = r"(?P<name>[^/]+)"
    return [
        (url_path_join(base, "monarch", "meshes"), MeshesHandler),
        (url_path_join(base, "monarch", "events"), EventsHandler),
        (url_path_join(base, "monarch", "meshes", name, "logs"), LogsHandler),
        (url_path_join(base, "monarch", "meshes", name, "stacks"), StacksHandler),
        (url_path_join(base, "monarch", "meshes", name, "down"), DownHandler),
    ]


__all__ = ["EVERY_S", "handlers", "snapshot"]
