"""The inspector and the Meshes panel of a mesh on 16 test hosts, in JupyterLab in
headless Chromium: one cell per rank grouped by host, a summary per host, details
on demand, no sideways scroll in the panel, a killed rank shown dead in both
(``tests/browser/scale_views.py``, run on the cluster's login host).

CI runs 16 hosts x 8 procs (128 ranks: beyond 64 the views read through the agents,
VIEW-2). ``MONARCH_VIEWS_HOSTS=64 MONARCH_VIEWS_PROCS=16`` runs it at the full 1,024
ranks; the screenshots go to ``MONARCH_SCREENSHOTS`` (``/tmp``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_checks import down_all

from tools.testcluster import Cluster

pytestmark = [pytest.mark.scale, pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HOSTS = int(os.environ.get("MONARCH_VIEWS_HOSTS", "16"))
PER_HOST = int(os.environ.get("MONARCH_VIEWS_PROCS", "8"))
CHROMIUM = os.environ.get("MONARCH_CHROMIUM", "/usr/bin/chromium")


@pytest.mark.timeout(1200)
def test_the_inspector_and_the_panel_show_a_mesh_on_many_hosts_as_a_grid_by_host(
    can_make_clusters: None, state_home: Path
) -> None:
    if os.environ.get("MONARCH_SKIP_BROWSER") == "1":
        pytest.skip("MONARCH_SKIP_BROWSER=1")
    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium"
    with Cluster.up(hosts=HOSTS) as cluster:
        cfg = {
            "hosts": HOSTS,
            "per_host": PER_HOST,
            "partition": cluster.partition,
            "shots": os.environ.get("MONARCH_SCREENSHOTS", "/tmp"),
        }
        env = {
            **os.environ,
            **cluster.env(),
            "XDG_STATE_HOME": str(state_home),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "browser")]),
        }
        env.pop("MONARCH_TRANSFER_HOST", None)
        script = [sys.executable, str(ROOT / "tests" / "browser" / "scale_views.py"), json.dumps(cfg)]
        try:
            done = subprocess.run(
                cluster.login_cmd(script), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
            )
            assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        finally:
            down_all(cluster, state_home)  # and nothing of ours left on any host
