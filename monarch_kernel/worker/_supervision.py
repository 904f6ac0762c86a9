"""The supervision tree on the worker's side (OWN-1, stated in ``mesh._control``):
where a failure of an actor here goes (the actor that spawned it, else this worker's
controller), an owner's ``__supervise__`` run in order with its messages, and a
failure its owner did not handle failing the owner in turn.

A part of ``Dispatcher`` (see ``_dispatcher``): these functions are its methods."""

from __future__ import annotations

import inspect
import os
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any

from monarch_kernel._wire import ACTOR_FAILURE_MARK
from monarch_kernel.mesh import MeshFailure, actor_context, escalates, user_fault_hook

if TYPE_CHECKING:
    from monarch_kernel.worker._state import DispatcherLike

#: This worker's mesh, as failures name it.
_MESH = os.environ.get("MONARCH_MESH", "mesh")


def actor_failed(d: DispatcherLike, actor: str, message: str) -> None:
    """Supervision of a failure of ``actor`` (OWN-1): to the actor that spawned it
    (the port it gave, ``supervise``), else to this worker's controller, else (the
    controller's own ``this_proc()``, whose owner is the client itself) to the user's
    ``unhandled_fault_hook``, as Monarch delivers it, or on stderr."""
    sup = d._supervisors.get(actor)
    if sup is not None:
        owner, port = sup
        rank = d.point.rank if len(d.point) else None
        try:
            port.send((owner, MeshFailure(_MESH, "actor_failed", message, rank)))
            return
        except Exception as e:  # its owner is gone: the controller hears of it instead
            print(f"monarch: the owner of actor {actor!r} did not get its failure: {e}", file=sys.stderr)
    if escalates():
        report_failure(actor, message)
    elif not user_fault_hook(MeshFailure("this_proc", "actor_failed", message, None)):
        print(f"monarch: {message}", file=sys.stderr, flush=True)


def supervise_owner(d: DispatcherLike, actor: str, failure: Any, limit: float = 60.0) -> bool:
    """Runs ``actor.__supervise__(failure)`` in order with its messages (on its
    thread, or its event loop); whether it handled the failure (returned true)."""
    a = d.actors.get(actor)
    hook = getattr(a.instance, "__supervise__", None) if a is not None else None
    if a is None or hook is None:
        return False
    done = threading.Event()
    out: list[Any] = [False]

    def raised() -> None:
        traceback.print_exc()
        print(f"monarch: {actor}.__supervise__ raised (above): the failure is unhandled", file=sys.stderr)

    def run() -> None:
        reset = actor_context.set(a.context)
        try:
            out[0] = hook(failure)
        except BaseException:
            raised()
        finally:
            actor_context.reset(reset)
            done.set()

    async def run_async() -> None:
        try:
            result = hook(failure)
            out[0] = (await result) if inspect.isawaitable(result) else result
        except BaseException:
            raised()
        finally:
            done.set()

    if a.runner is not None:
        a.runner.submit(run)
    else:
        import asyncio

        asyncio.run_coroutine_threadsafe(run_async(), d._async())
    if not done.wait(limit):
        print(
            f"monarch: {actor}.__supervise__ did not run within {limit:.0f} s: the failure is unhandled",
            file=sys.stderr,
        )
        return False
    return bool(out[0])


def send_up(d: DispatcherLike, owner: str, mesh: str, failure: Any) -> None:
    """OWN-1: a failure of mesh ``mesh`` that its owner ``owner`` did not handle
    fails the owner, as in Monarch (DISPATCH-4: later calls to it say why), and goes
    up to its own supervisor as a failure of the owner."""
    a = d.actors.get(owner)
    what = mesh if mesh.startswith("actors it spawned") else f"its mesh {mesh!r}"
    why = f"{what} had a failure it did not handle:\n{failure.message}"
    if a is not None:
        d._end_actor(a, why)
    else:
        d._actor_failed(owner, f"actor {owner} failed: {why}")


def report_failure(actor: str, message: str) -> None:
    """Tells this worker's controller (by a line its agent forwards) that an actor failed."""
    import json

    line = ACTOR_FAILURE_MARK + json.dumps({"actor": actor, "message": message[:16384]})
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


__all__ = ["actor_failed", "report_failure", "send_up", "supervise_owner"]
