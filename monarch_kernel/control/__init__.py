"""The kernel's management client of host agents (grpcio): the one client of the
``HostAgent`` service, and the typed kinds of the worker output lines it carries."""

from monarch_kernel.control._agent_client import (
    MAX_TAIL,
    WORKER_EXITED,
    WORKER_RUNNING,
    AgentClient,
    agent_client,
    check_tail,
    has_exited,
    set_kernel_id,
    worker_dict,
)
from monarch_kernel.control._events import ActorFailure, DisplayMessage, LineKind, Prompt
from monarch_kernel.control._group import AgentGroup, HostLink
from monarch_kernel.control._window import LineWindow, MergedLine, ranks_label

__all__ = [
    "MAX_TAIL",
    "WORKER_EXITED",
    "WORKER_RUNNING",
    "ActorFailure",
    "AgentClient",
    "AgentGroup",
    "HostLink",
    "DisplayMessage",
    "LineKind",
    "LineWindow",
    "MergedLine",
    "Prompt",
    "agent_client",
    "check_tail",
    "has_exited",
    "ranks_label",
    "set_kernel_id",
    "worker_dict",
]
