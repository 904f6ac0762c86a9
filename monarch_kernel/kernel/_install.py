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


#: What enables the server extension of the meshes panel (``monarch_kernel.server``).
SERVER_CONFIG = {"ServerApp": {"jpserver_extensions": {"monarch_kernel.server": True}}}


def enable_server_extension(user: bool = False, prefix: str | None = None) -> Path:
    """Enables the meshes panel's server extension for Jupyter servers of this
    environment (or the user's); returns the config file written."""
    if user:
        from jupyter_core.paths import jupyter_config_dir

        where = Path(jupyter_config_dir())
    else:
        where = Path(prefix or sys.prefix) / "etc" / "jupyter"
    path = where / "jupyter_server_config.d" / "monarch_kernel.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(SERVER_CONFIG, indent=1) + "\n")
    return path


def install(user: bool = False, prefix: str | None = None) -> str:
    """Installs the kernelspec, and enables the server extension of the meshes panel;
    returns where the kernelspec went. Default: this environment (``sys.prefix``),
    so a venv's Jupyter finds it."""
    from jupyter_client.kernelspec import KernelSpecManager

    enable_server_extension(user, prefix)

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / KERNEL_NAME
        d.mkdir()
        (d / "kernel.json").write_text(json.dumps(spec(), indent=1))
        if user:
            return str(KernelSpecManager().install_kernel_spec(str(d), KERNEL_NAME, user=True))
        return str(KernelSpecManager().install_kernel_spec(str(d), KERNEL_NAME, prefix=prefix or sys.prefix))


__all__ = ["SERVER_CONFIG", "enable_server_extension", "install", "spec"]
