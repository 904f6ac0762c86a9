"""Entry point of a host agent process (``python -m monarch_kernel.hosts._agent_main``).

Reads its configuration (token included) as one JSON line on stdin, starts the native
agent, prints ``MONARCH_AGENT_READY <addr>``, then runs until the agent stops.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable


def main() -> None:
    cfg = json.loads(sys.stdin.readline())
    from monarch_kernel import _native

    agent = _native.start_agent(
        cfg["name"], cfg["token"], cfg["log_dir"], float(cfg["idle_timeout"]), meta=cfg.get("meta", "")
    )
    state_file = cfg.get("state_file", "")
    if state_file and cfg.get("record"):  # REGISTRY-2: listed from the first moment
        record = {**cfg["record"], "agent_addr": agent.addr, "agent_pid": os.getpid()}
        try:
            _write(state_file, json.dumps(record, indent=1).encode())
        except OSError as e:  # the controller's own write tells the user
            print(
                f"monarch agent: cannot write the state file {state_file}: {e}", file=sys.stderr, flush=True
            )
    sys.stdout.write(f"MONARCH_AGENT_READY {agent.addr}\n")
    sys.stdout.flush()
    # Nobody reads our stdout from now on: send it to the log like stderr.
    os.dup2(2, 1)
    stop = threading.Event()
    keeper = threading.Thread(
        target=_keep_state_file,
        args=(cfg.get("state_file", ""), cfg["token"], stop, lambda: agent.stopping),
        daemon=True,
    )
    keeper.start()
    agent.wait()
    stop.set()
    keeper.join(5.0)
    _forget(cfg.get("state_file", ""), cfg["token"])
    _native.shutdown_runtime()
    os._exit(0)


def _keep_state_file(
    state_file: str, token: str, stop: threading.Event, stopping: Callable[[], bool], every: float = 1.0
) -> None:
    """REGISTRY-2: the state file is the only way to find a running mesh, so while
    the agent runs it puts back a copy of its file if the file goes missing or is
    corrupt (a controller removes a corrupt file; a person may delete one), instead
    of running on unseen until its idle timeout. A file of another mesh of the same
    name (another token) is left alone."""
    if not state_file:
        return
    saved: bytes | None = None
    try:  # what this agent wrote at start, if it did
        with open(state_file, "rb") as f:
            first = f.read()
        if json.loads(first).get("token") == token:
            saved = first
    except (OSError, ValueError, AttributeError):
        pass
    while not stop.wait(every if saved is not None else 0.1):  # often until the first copy
        try:
            with open(state_file, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = None
        except OSError:
            continue
        if data is not None:
            try:
                rec = json.loads(data)
            except ValueError:
                rec = None  # corrupt
            if isinstance(rec, dict):
                if rec.get("token") == token:
                    saved = data
                continue  # ours (kept), or another mesh's: left alone
        if saved is None or stopping():
            continue  # the controller has not written it yet, or removes it as the mesh stops
        try:
            _write(state_file, saved)
            print(f"monarch agent: restored the state file {state_file}", file=sys.stderr, flush=True)
        except OSError:
            pass


def _write(state_file: str, data: bytes) -> None:
    """Writes the state file atomically, readable by its owner only."""
    tmp = f"{state_file}.{os.getpid()}.restore"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, state_file)


def _forget(state_file: str, token: str) -> None:
    """Removes the mesh's state file if it still describes this mesh (a mesh created
    again under the same name has a new file, with another token)."""
    if not state_file:
        return
    try:
        with open(state_file) as f:
            if json.load(f).get("token") == token:
                os.unlink(state_file)
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    main()
