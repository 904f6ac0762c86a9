"""The kernel's management client of host agents (grpcio): the one client of the
``HostAgent`` service, and the typed kinds of the worker output lines it carries."""

from monarch_kernel.control._agent_client import (
    WORKER_EXITED,
    WORKER_RUNNING,
    AgentClient,
    agent_client,
    has_exited,
    worker_dict,
)
from monarch_kernel.control._events import ActorFailure, DisplayMessage, LineKind, Prompt

__all__ = [
    "WORKER_EXITED",
    "WORKER_RUNNING",
    "ActorFailure",
    "AgentClient",
    "DisplayMessage",
    "LineKind",
    "Prompt",
    "agent_client",
    "has_exited",
    "worker_dict",
]
