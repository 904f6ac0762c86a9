"""The mesh API: shapes, value meshes, futures, proc meshes and actor meshes: what
runs in every process (controllers, workers, plain scripts); never imports Jupyter,
the worker or the controller (where proc meshes come from: ``monarch_kernel.controller``).

Names are imported on first use (PEP 562), so ``monarch_kernel.actor`` can use the
shape types without importing the whole mesh API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from monarch_kernel._lazy import lazy_getattr

if TYPE_CHECKING:
    from monarch_kernel.actor import _ROOT as root_context
    from monarch_kernel.actor import _current as actor_context
    from monarch_kernel.mesh._actor_mesh import ActorMesh, Endpoint, NotAnEndpoint, decode_reply, set_rref
    from monarch_kernel.mesh._buffers import calling_token, know_token, prefer_huge_pages, wait_read
    from monarch_kernel.mesh._builtin import call_builtin, send_calls
    from monarch_kernel.mesh._control import (
        MeshControl,
        MeshFailure,
        adopt,
        escalate,
        escalates,
        owner_handles,
        owns,
        stop_owned,
        unhandled_fault_hook,
        user_fault_hook,
    )
    from monarch_kernel.mesh._future import (
        Done,
        Future,
        escalate_interrupted,
        interrupt,
        set_slow_wait,
        wait_calls,
    )
    from monarch_kernel.mesh._port import Channel, Port, PortReceiver, RankedPortReceiver, local_address
    from monarch_kernel.mesh._port import deliver as deliver_port_message
    from monarch_kernel.mesh._proc_mesh import SPAWN_TIMEOUT, ProcMesh, current_proc
    from monarch_kernel.mesh._proc_ref import MeshState, ProcRef, death_error, describe, tail_lines
    from monarch_kernel.mesh._proc_rows import states_count, status_text
    from monarch_kernel.mesh._role import (
        here,
        install_actors,
        install_controller,
        install_worker,
        set_this_proc,
    )
    from monarch_kernel.mesh._serial import dumps, dumps_exception, loads
    from monarch_kernel.mesh._shape import Extent, MeshTrait, Point, Shape
    from monarch_kernel.mesh._transfer_buffer import TransferBuffer, gather, scatter
    from monarch_kernel.mesh._value_mesh import ValueMesh

_LAZY: dict[str, str] = {
    # (``actor_context``, ``root_context``: what runs actors sets the context their code
    # sees, ``context()``: the worker's dispatcher, and the controller's spawns that
    # belong to no actor.)
    "actor_context": "monarch_kernel.actor:_current",
    "ActorMesh": "monarch_kernel.mesh._actor_mesh",
    "adopt": "monarch_kernel.mesh._control",
    "call_builtin": "monarch_kernel.mesh._builtin",
    "send_calls": "monarch_kernel.mesh._builtin",
    "Channel": "monarch_kernel.mesh._port",
    "current_proc": "monarch_kernel.mesh._proc_mesh",
    "states_count": "monarch_kernel.mesh._proc_rows",
    "status_text": "monarch_kernel.mesh._proc_rows",
    "death_error": "monarch_kernel.mesh._proc_ref",
    "decode_reply": "monarch_kernel.mesh._actor_mesh",
    "deliver_port_message": "monarch_kernel.mesh._port:deliver",
    "describe": "monarch_kernel.mesh._proc_ref",
    "dumps": "monarch_kernel.mesh._serial",
    "dumps_exception": "monarch_kernel.mesh._serial",
    "Endpoint": "monarch_kernel.mesh._actor_mesh",
    "set_rref": "monarch_kernel.mesh._actor_mesh",
    "escalate": "monarch_kernel.mesh._control",
    "escalate_interrupted": "monarch_kernel.mesh._future",
    "escalates": "monarch_kernel.mesh._control",
    "Extent": "monarch_kernel.mesh._shape",
    "Future": "monarch_kernel.mesh._future",
    "Done": "monarch_kernel.mesh._future",
    "gather": "monarch_kernel.mesh._transfer_buffer",
    "here": "monarch_kernel.mesh._role",
    "install_actors": "monarch_kernel.mesh._role",
    "install_controller": "monarch_kernel.mesh._role",
    "install_worker": "monarch_kernel.mesh._role",
    "interrupt": "monarch_kernel.mesh._future",
    "know_token": "monarch_kernel.mesh._buffers",
    "calling_token": "monarch_kernel.mesh._buffers",
    "loads": "monarch_kernel.mesh._serial",
    "local_address": "monarch_kernel.mesh._port",
    "MeshControl": "monarch_kernel.mesh._control",
    "MeshFailure": "monarch_kernel.mesh._control",
    "MeshState": "monarch_kernel.mesh._proc_ref",
    "MeshTrait": "monarch_kernel.mesh._shape",
    "NotAnEndpoint": "monarch_kernel.mesh._actor_mesh",
    "owner_handles": "monarch_kernel.mesh._control",
    "owns": "monarch_kernel.mesh._control",
    "Point": "monarch_kernel.mesh._shape",
    "Port": "monarch_kernel.mesh._port",
    "PortReceiver": "monarch_kernel.mesh._port",
    "prefer_huge_pages": "monarch_kernel.mesh._buffers",
    "ProcMesh": "monarch_kernel.mesh._proc_mesh",
    "ProcRef": "monarch_kernel.mesh._proc_ref",
    "RankedPortReceiver": "monarch_kernel.mesh._port",
    "root_context": "monarch_kernel.actor:_ROOT",
    "scatter": "monarch_kernel.mesh._transfer_buffer",
    "set_slow_wait": "monarch_kernel.mesh._future",
    "set_this_proc": "monarch_kernel.mesh._role",
    "Shape": "monarch_kernel.mesh._shape",
    "SPAWN_TIMEOUT": "monarch_kernel.mesh._proc_mesh",
    "stop_owned": "monarch_kernel.mesh._control",
    "tail_lines": "monarch_kernel.mesh._proc_ref",
    "TransferBuffer": "monarch_kernel.mesh._transfer_buffer",
    "unhandled_fault_hook": "monarch_kernel.mesh._control",
    "user_fault_hook": "monarch_kernel.mesh._control",
    "ValueMesh": "monarch_kernel.mesh._value_mesh",
    "wait_calls": "monarch_kernel.mesh._future",
    "wait_read": "monarch_kernel.mesh._buffers",
}

__all__ = [
    "actor_context",
    "ActorMesh",
    "adopt",
    "call_builtin",
    "send_calls",
    "Channel",
    "current_proc",
    "death_error",
    "decode_reply",
    "deliver_port_message",
    "describe",
    "dumps",
    "dumps_exception",
    "Endpoint",
    "set_rref",
    "escalate",
    "escalate_interrupted",
    "escalates",
    "Extent",
    "Done",
    "Future",
    "gather",
    "here",
    "install_actors",
    "install_controller",
    "install_worker",
    "interrupt",
    "know_token",
    "calling_token",
    "loads",
    "local_address",
    "MeshControl",
    "MeshFailure",
    "MeshState",
    "MeshTrait",
    "NotAnEndpoint",
    "owner_handles",
    "owns",
    "Point",
    "Port",
    "PortReceiver",
    "prefer_huge_pages",
    "ProcMesh",
    "ProcRef",
    "RankedPortReceiver",
    "root_context",
    "scatter",
    "set_slow_wait",
    "set_this_proc",
    "Shape",
    "SPAWN_TIMEOUT",
    "states_count",
    "status_text",
    "stop_owned",
    "tail_lines",
    "TransferBuffer",
    "unhandled_fault_hook",
    "user_fault_hook",
    "ValueMesh",
    "wait_calls",
    "wait_read",
]

__getattr__ = lazy_getattr(__name__, _LAZY)
