"""The Jupyter kernel: an IPython kernel that is the controller of meshes, with the
``%mesh`` / ``%%mesh`` magics. Installed as the kernelspec ``monarch`` by
``monarch-kernel install``; started as ``python -m monarch_kernel.kernel -f FILE``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monarch_kernel._lazy import lazy_getattr

if TYPE_CHECKING:
    from monarch_kernel.kernel._install import install

KERNEL_NAME = "monarch"
DISPLAY_NAME = "Python 3 (monarch mesh)"

__all__ = ["DISPLAY_NAME", "KERNEL_NAME", "install"]

# (``install`` on first use: the kernel process itself never needs it)
__getattr__ = lazy_getattr(__name__, {"install": "monarch_kernel.kernel._install"})
