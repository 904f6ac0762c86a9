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

    agent = _native.start_agent(cfg["name"], cfg["token"], cfg["log_dir"], float(cfg["idle_timeout"]))
    sys.stdout.write(f"MONARCH_AGENT_READY {agent.addr}\n")
    sys.stdout.flush()
    # Nobody reads our stdout from now on: send it to the log like stderr.
    os.dup2(2, 1)
    agent.wait()
    _native.shutdown_runtime()
    os._exit(0)


if __name__ == "__main__":
    main()
