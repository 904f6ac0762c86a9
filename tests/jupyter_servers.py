"""A Jupyter server (plain, or JupyterLab) of this venv, started for a test module on
loopback with a token of its own and stopped (its process group) at the end; and a
named mesh started by a script that then exits. The server extension's tests and
the browser tests share them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def jupyter_server(
    app: str, root: Path, env: dict[str, str], args: tuple[str, ...] = ()
) -> Iterator[tuple[str, str]]:
    """``python -m APP`` (``jupyter_server`` or ``jupyterlab``) serving ``root``: (URL, token)."""
    port, token = free_port(), uuid.uuid4().hex
    log = root / "server.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            app,
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            "--ip=127.0.0.1",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            *args,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),  # noqa: SIM115
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{app} did not start:\n" + log.read_text()) from None
                time.sleep(0.3)
        yield url, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server shuts its kernels down
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


SCRIPT = """
import sys
from monarch_kernel import Actor, endpoint, this_host
class Talker(Actor):
    @endpoint
    def say(self, text):
        print(text, flush=True)
        return text
procs = this_host().spawn_procs(per_host={"procs": 2}, name=sys.argv[1])
procs.spawn("talker", Talker).say.call("said from the script").get()
"""


@contextmanager
def script_mesh(folder: Path, prefix: str = "panel") -> Iterator[str]:
    """A named mesh of 2 procs started by a script that exits (it printed "said from
    the script" on both ranks); stopped at the end."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    path = folder / "start_mesh.py"
    path.write_text(SCRIPT)
    subprocess.run([sys.executable, str(path), name], check=True, timeout=120)
    try:
        yield name
    finally:
        subprocess.run(
            [sys.executable, "-m", "monarch_kernel", "down", name], capture_output=True, timeout=60
        )
