"""Where meshes live on a host: starting host agents (allocators), their state files
(``_registry``), GPU placement (``_placement``), and administering a running mesh
through its agent without being its controller (``_admin``)."""

from monarch_kernel.hosts._local import AgentProcess, start_local_agent, state_dir

__all__ = ["AgentProcess", "start_local_agent", "state_dir"]
