"""``make demo-multihost``: brings up the test cluster (hosts in network namespaces
with sshd and SLURM, see docs/testing-multihost.md), executes
notebooks/multihost.ipynb through the monarch kernel on its login host, prints it as
a reader would see it, and removes the cluster.

    python -m demo.run_multihost [--save OUT.ipynb]     # from the repository's root
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.testcluster import Cluster, unavailable

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    if reason := unavailable():
        print(f"make demo-multihost needs a test cluster, and this machine cannot make one: {reason}")
        return 2
    Cluster.reap_stale()
    with Cluster.up(hosts=2) as cluster, tempfile.TemporaryDirectory(prefix="monarch-demo-") as state:
        env = {
            **os.environ,
            **cluster.env(),
            "XDG_STATE_HOME": state,
            "MONARCH_DEMO_PARTITION": cluster.partition,
        }
        argv = [
            sys.executable,
            str(ROOT / "demo" / "run_notebook.py"),
            "notebooks/multihost.ipynb",
            *sys.argv[1:],
        ]
        done = subprocess.run(cluster.login_cmd(argv), env=env, cwd=ROOT)
        return done.returncode


if __name__ == "__main__":
    sys.exit(main())
