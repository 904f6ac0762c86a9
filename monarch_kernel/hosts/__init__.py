"""Where meshes live on a host: starting host agents (allocators), their state files
(``_registry``), GPU placement (``_placement``), and administering a running mesh
through its agent without being its controller (``_admin``).

Names are imported on first use (PEP 562): a worker needs only ``_placement`` at
start, and its start-up time is every mesh's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monarch_kernel._lazy import lazy_getattr

if TYPE_CHECKING:
    from monarch_kernel.hosts._local import AgentProcess, start_local_agent, state_dir

_LAZY: dict[str, str] = {
    "AgentProcess": "monarch_kernel.hosts._local",
    "start_local_agent": "monarch_kernel.hosts._local",
    "state_dir": "monarch_kernel.hosts._local",
}

__all__ = ["AgentProcess", "start_local_agent", "state_dir"]

__getattr__ = lazy_getattr(__name__, _LAZY)
