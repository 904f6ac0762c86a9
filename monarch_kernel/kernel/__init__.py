"""The Jupyter kernel: an IPython kernel that is the controller of meshes, with the
``%mesh`` / ``%%mesh`` magics. Installed as the kernelspec ``monarch`` by
``monarch-kernel install``; started as ``python -m monarch_kernel.kernel -f FILE``."""

from __future__ import annotations

KERNEL_NAME = "monarch"
DISPLAY_NAME = "Python 3 (monarch mesh)"

__all__ = ["DISPLAY_NAME", "KERNEL_NAME"]
