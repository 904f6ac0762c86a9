"""``monarch-kernel install``: the kernelspec ``monarch``."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from monarch_kernel.kernel import DISPLAY_NAME, KERNEL_NAME


def spec() -> dict[str, object]:
    return {
        "argv": [sys.executable, "-m", "monarch_kernel.kernel", "-f", "{connection_file}"],
        "display_name": DISPLAY_NAME,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"debugger": False},
    }


def install(user: bool = False, prefix: str | None = None) -> str:
    """Installs the kernelspec; returns where it went. Default: this environment
    (``sys.prefix``), so a venv's Jupyter finds it."""
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / KERNEL_NAME
        d.mkdir()
        (d / "kernel.json").write_text(json.dumps(spec(), indent=1))
        if user:
            return str(KernelSpecManager().install_kernel_spec(str(d), KERNEL_NAME, user=True))
        return str(KernelSpecManager().install_kernel_spec(str(d), KERNEL_NAME, prefix=prefix or sys.prefix))


__all__ = ["install", "spec"]
