"""Allocators: where host agents (and so worker processes) come from."""

from monarch_kernel.hosts._local import AgentProcess, start_local_agent, state_dir

__all__ = ["AgentProcess", "start_local_agent", "state_dir"]
