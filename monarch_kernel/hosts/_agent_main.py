"""Entry point of a host agent process (``python -m monarch_kernel.hosts._agent_main``).

Reads its configuration (token included) as one JSON line on stdin, starts the native
agent, prints ``MONARCH_AGENT_READY <addr>``, then runs until the agent stops.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    cfg = json.loads(sys.stdin.readline())
    from monarch_kernel import _native

    agent = _native.start_agent(
        cfg["name"], cfg["token"], cfg["log_dir"], float(cfg["idle_timeout"]), meta=cfg.get("meta", "")
    )
    sys.stdout.write(f"MONARCH_AGENT_READY {agent.addr}\n")
    sys.stdout.flush()
    # Nobody reads our stdout from now on: send it to the log like stderr.
    os.dup2(2, 1)
    agent.wait()
    _forget(cfg.get("state_file", ""), cfg["token"])
    _native.shutdown_runtime()
    os._exit(0)


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
