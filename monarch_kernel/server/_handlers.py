"""HTTP handlers of the server extension (see the package docstring)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any

import tornado.iostream
import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from monarch_kernel.control import MAX_TAIL
from monarch_kernel.controller import ask_workers, meshes_view, owner_text
from monarch_kernel.errors import (
    AgentUnresponsiveError,
    MeshAuthError,
    MeshNotFoundError,
    MeshSpecError,
    MonarchKernelError,
)
from monarch_kernel.hosts import connect, mesh_info, registry

#: How often the events stream looks at the agents while someone listens.
EVERY_S = 0.5
#: How long an events stream stays silent before it sends a comment (so that a
#: browser that went away is noticed, and its listening ends).
KEEPALIVE_S = 15.0
#: How long a respawn asked of the owning kernel may wait (a busy kernel runs it
#: when its cell ends).
RESPAWN_WAIT_S = 120.0


class _Handler(APIHandler):  # type: ignore[misc]
    """An API handler whose errors say exactly what was raised: tornado doubles each
    ``%`` of an HTTPError's message given without arguments (for its log's
    formatting), and jupyter_server's APIHandler answers with that doubled text
    ("%%mesh respawn"); the message is given back here as it was written."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        e = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(e, tornado.web.HTTPError) and e.log_message and not e.args:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"message": e.log_message.replace("%%", "%"), "reason": e.reason}))
            return
        super().write_error(status_code, **kwargs)


def _name(name: str) -> str:
    """SERVER-1: ``name`` as a mesh name, or a 400 that says why."""
    try:
        registry.check_name(name)
    except MeshSpecError as e:
        raise tornado.web.HTTPError(400, str(e)) from None
    return name


class MeshesHandler(_Handler):
    @tornado.web.authenticated
    async def get(self) -> None:
        meshes = await asyncio.get_running_loop().run_in_executor(None, meshes_view)
        self.finish(json.dumps({"meshes": meshes}))


class _Looker:
    """One look at the meshes every ``EVERY_S`` while anyone listens, however many
    listen (browser tabs, users of one server): each listener waits for the next
    picture that differs from the one it has, so N tabs cost the workers one look."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.listeners = 0
        self.changed = asyncio.Condition()
        self.task: asyncio.Task[None] | None = None

    async def _look(self) -> None:
        loop = asyncio.get_running_loop()
        while self.listeners:
            try:
                meshes = await loop.run_in_executor(None, meshes_view)
                text = json.dumps({"meshes": meshes}, sort_keys=True)
            except Exception as e:  # a look that fails now may work in a moment
                text = json.dumps({"meshes": [], "error": f"{type(e).__name__}: {e}"})
            if text != self.text:
                async with self.changed:
                    self.text = text
                    self.changed.notify_all()
            await asyncio.sleep(EVERY_S)
        self.task, self.text = None, None  # (the next listener waits for a fresh look)

    async def next(self, after: str | None) -> str:
        """The picture, once it differs from ``after``."""
        if self.task is None:
            self.task = asyncio.ensure_future(self._look())
        async with self.changed:
            await self.changed.wait_for(lambda: self.text is not None and self.text != after)
            assert self.text is not None
            return self.text


class EventsHandler(_Handler):
    """Server-sent events: the picture of the meshes each time it changes."""

    @tornado.web.authenticated
    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        looker, last = self.settings.setdefault("monarch_looker", _Looker()), None
        looker.listeners += 1
        try:
            while True:
                try:
                    last = await asyncio.wait_for(looker.next(last), KEEPALIVE_S)
                    self.write(f"data: {last}\n\n")
                except TimeoutError:  # a comment: a closed stream shows on writing
                    self.write(": nothing changed\n\n")
                await self.flush()
        except tornado.iostream.StreamClosedError:
            return  # the browser went away
        finally:
            looker.listeners -= 1


#: The HTTP status of what a mesh's agents answer, or do not: not running (404), not
#: reachable from this server (503: it may run; the message says where), its agent
#: refusing the state file's token (409).
_STATUS_OF_ERROR: list[tuple[type[MonarchKernelError], int]] = [
    (MeshNotFoundError, 404),
    (AgentUnresponsiveError, 503),
    (MeshAuthError, 409),
]


def _http_error(e: MonarchKernelError) -> tornado.web.HTTPError:
    status = next((code for cls, code in _STATUS_OF_ERROR if isinstance(e, cls)), 500)
    return tornado.web.HTTPError(status, str(e))


async def _with_mesh(name: str, work: Callable[[Any, Any], Any]) -> Any:
    """``work(record, agents)`` for the running mesh ``name`` (off the event loop); a
    404 that says so when it is not running, a 503 when its agents cannot be reached
    from here (REGISTRY-3: it may run; nothing is removed)."""

    def run() -> Any:
        rec = registry.read(name)
        client = connect(rec) if rec is not None else None
        if rec is None or client is None:
            raise MeshNotFoundError(f"no mesh named {name!r} is running")
        try:
            return work(rec, client)
        finally:
            client.close()

    try:
        return await asyncio.get_running_loop().run_in_executor(None, run)
    except (MeshNotFoundError, AgentUnresponsiveError, MeshAuthError) as e:
        raise _http_error(e) from None


def _int_argument(
    handler: _Handler, name: str, default: int | None, least: int, most: int | None
) -> int | None:
    """The query argument ``name`` as an integer from ``least`` to ``most`` (what the
    value's wire field holds; None: checked by the caller, as a rank against its
    mesh), or a 400 that says what it must be."""
    text = handler.get_query_argument(name, None)
    if text in (None, ""):
        return default
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise tornado.web.HTTPError(400, f"{name} must be a whole number of at least {least}, not {text!r}")
    if most is not None and value > most:
        raise tornado.web.HTTPError(
            400, f"{name} must be a whole number from {least} to {most}, not {text!r}"
        )
    return value


class LogsHandler(_Handler):
    """The last lines the workers printed, each labelled with its rank (``?rank=R``:
    one rank's; ``?tail=N``: how many per rank)."""

    @tornado.web.authenticated
    async def get(self, name: str) -> None:
        name = _name(name)
        rank = _int_argument(self, "rank", None, 0, None)  # (below: one of the mesh's ranks)
        tail = _int_argument(self, "tail", 100, 1, MAX_TAIL)

        def read(_rec: Any, agents: Any) -> list[str]:
            if rank is not None and rank >= len(agents.list_workers()):
                raise tornado.web.HTTPError(400, f"mesh {name!r} has no rank {rank}")
            return list(agents.logs(rank=rank, tail=tail, labelled=True))

        self.finish(json.dumps({"mesh": name, "lines": await _with_mesh(name, read)}))


class StacksHandler(_Handler):
    """What each running worker of a mesh runs now (its Python stacks)."""

    @tornado.web.authenticated
    async def get(self, name: str) -> None:
        name = _name(name)

        def read(rec: Any, agents: Any) -> list[dict[str, Any]]:
            live = [w for w in agents.list_workers() if w["state"] == "running"]
            stacks = ask_workers(rec, live, "stacks", 10.0)
            return [{"rank": w["rank"], "stacks": s or "(no answer)"} for w, s in zip(live, stacks)]

        self.finish(json.dumps({"mesh": name, "ranks": await _with_mesh(name, read)}))


class DownHandler(_Handler):
    @tornado.web.authenticated
    async def post(self, name: str) -> None:
        name = _name(name)
        from monarch_kernel.controller import down_one

        try:
            what = await asyncio.get_running_loop().run_in_executor(None, down_one, name)
        except (MeshNotFoundError, AgentUnresponsiveError, MeshAuthError) as e:
            raise _http_error(e) from None
        self.finish(json.dumps({"mesh": name, "result": what}))


#: The HTTP status of what ``monarch-kernel respawn`` refuses.
_STATUS_OF = {
    "MeshOwnershipError": 409,
    "MeshNotFoundError": 404,
    "MeshUnreachableError": 503,
    "AgentUnresponsiveError": 503,
}


class RespawnHandler(_Handler):
    """Restarts a mesh's dead ranks where that may be done: by the kernel of this
    server that holds the mesh (``%mesh respawn``, run silently in it), or, when no
    controller holds it, by ``monarch-kernel respawn`` as an administrator. A mesh
    held by a controller this server cannot reach is refused (409), naming it."""

    @tornado.web.authenticated
    async def post(self, name: str) -> None:
        name = _name(name)
        loop = asyncio.get_running_loop()
        info = await loop.run_in_executor(None, mesh_info, name)
        if info is None:
            raise tornado.web.HTTPError(404, f"no mesh named {name!r} is running")
        if info.unreachable is not None:
            raise tornado.web.HTTPError(503, info.unreachable)
        kernel_id = (info.owner or {}).get("kernel_id") if info.attached else None
        if info.attached and kernel_id in self.kernel_manager.list_kernel_ids():
            ranks, via = await self._in_kernel(kernel_id, name), "kernel"
        elif info.attached:
            raise tornado.web.HTTPError(
                409,
                f"mesh {name!r} is held by {owner_text(info.owner)}, which this server does not run: "
                f"respawn its dead ranks there (procs.respawn() or %mesh respawn {name})",
            )
        else:
            ranks, via = await self._as_administrator(name), "administrator"
        self.finish(json.dumps({"mesh": name, "ranks": ranks, "via": via}))

    async def _in_kernel(self, kernel_id: str, name: str) -> list[int]:
        """``%mesh respawn NAME`` in the kernel, silently (no cell, no history): its
        value comes back as a user expression."""
        client = self.kernel_manager.get_kernel(kernel_id).client()
        next_reply: Any = client.get_shell_msg  # (a coroutine: the server's clients are async)
        client.start_channels()
        try:
            expr = f"get_ipython().run_line_magic('mesh', {('respawn ' + name)!r})"
            msg_id = client.execute("", silent=True, store_history=False, user_expressions={"ranks": expr})
            deadline = asyncio.get_running_loop().time() + RESPAWN_WAIT_S
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise tornado.web.HTTPError(
                        504,
                        f"the kernel holding mesh {name!r} did not answer in {RESPAWN_WAIT_S:.0f} s "
                        "(a cell still runs?): the respawn runs when it is free",
                    )
                reply = await next_reply(timeout=left)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
        finally:
            client.stop_channels()
        out = reply["content"].get("user_expressions", {}).get("ranks", {})
        if out.get("status") != "ok":
            why = out.get("evalue") or reply["content"].get("evalue") or "the kernel refused"
            raise tornado.web.HTTPError(500, f"respawn of mesh {name!r} in its kernel failed: {why}")
        return [int(r) for r in json.loads(out["data"]["text/plain"])]

    async def _as_administrator(self, name: str) -> list[int]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "monarch_kernel",
            "respawn",
            "--json",
            name,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        try:
            said = json.loads(out)
        except ValueError:  # it did not get as far as saying (a crash): its stderr says why
            raise tornado.web.HTTPError(500, err.decode(errors="replace").strip()[-2000:]) from None
        if "error" in said:
            raise tornado.web.HTTPError(_STATUS_OF.get(said["kind"], 500), said["error"])
        return [int(r) for r in said["ranks"]]


def handlers(base: str) -> list[tuple[str, Any]]:
    """The routes, under the server's base URL."""
    name = r"(?P<name>[^/]+)"
    return [
        (url_path_join(base, "monarch", "meshes"), MeshesHandler),
        (url_path_join(base, "monarch", "events"), EventsHandler),
        (url_path_join(base, "monarch", "meshes", name, "logs"), LogsHandler),
        (url_path_join(base, "monarch", "meshes", name, "stacks"), StacksHandler),
        (url_path_join(base, "monarch", "meshes", name, "respawn"), RespawnHandler),
        (url_path_join(base, "monarch", "meshes", name, "down"), DownHandler),
    ]


__all__ = ["EVERY_S", "handlers"]
