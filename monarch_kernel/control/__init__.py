"""The kernel's management client of host agents (grpcio): the one client of the
``HostAgent`` service."""

from monarch_kernel.control._agent_client import (
    WORKER_EXITED,
    WORKER_RUNNING,
    AgentClient,
    agent_client,
    has_exited,
    worker_dict,
)

__all__ = ["WORKER_EXITED", "WORKER_RUNNING", "AgentClient", "agent_client", "has_exited", "worker_dict"]
