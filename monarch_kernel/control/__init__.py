"""The kernel's management client of host agents (grpcio): the one client of the
``HostAgent`` service."""

from monarch_kernel.control._agent_client import AgentClient, agent_client

__all__ = ["AgentClient", "agent_client"]
