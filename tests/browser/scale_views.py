"""The inspector and the Meshes panel of a mesh on many test hosts, in JupyterLab in
headless Chromium (issue 27: "the inspector and the Meshes panel stay usable").

Run by ``tests/multihost/test_scale_views.py`` on the test cluster's login host (the
kernel must reach the hosts, and the browser the server: all of it in the login
host's namespace), with a JSON config: ``{"hosts", "per_host", "partition",
"shots"}``. A notebook cell brings ``hosts x per_host`` procs up through SLURM
(``%mesh up --slurm``); then, in the browser:

- the inspector under the cell is a grid of one cell per rank, in one group per host
  (in SLURM's node order: h2 before h10), each group's summary saying all its procs
  are alive; a rank's cell names its rank, state and pid on hover, and its logs and
  stacks come on a click;
- a ``%%mesh`` cell on every rank shows one merged display (``[ranks 0-127] loss
  0.31``, each rank's output folded under it), and ``%mesh pull`` brings a value
  from every rank;
- a new kernel (Kernel > Restart) reattaches with ``%mesh attach``, and ``%mesh
  status`` says ``1,024 procs on 64 hosts: 1,024 alive`` (a summary, not a line per
  proc) under a live inspector;
- the Meshes panel shows the same grid at its default width without a sideways
  scroll bar;
- a worker killed with SIGKILL turns its cell dead in both views.

Screenshots ``scale-inspector-live.png`` (the grid), ``scale-mesh-cell.png`` (the
``%%mesh`` cell, each rank's output unfolded) and ``scale-panel.png`` (at the end)
go to ``shots``. Exits 0
when all of that held; a failure raises (and leaves ``scale-*-failure.png``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import jupyter_servers
from test_inspector_browser import _notebook, _opened, _wait_for_idle_kernel

from monarch_kernel.kernel._install import install

#: Run on every rank (``%%mesh``): one line all print, one only rank 0 prints.
CELL = """%%mesh
from monarch_kernel import current_rank
x = current_rank().rank * 2
print("loss 0.31")
if x == 0:
    print("rank 0 saved the checkpoint")"""
#: A small value from every rank.
PULL = "xs = %mesh pull x\nlen(xs.values()), sum(xs.values())"

#: Long enough for 1,024 procs on 64 hosts on a 2-CPU machine (they come up in ~15 s).
UP_MS = 300_000


def main(cfg: dict[str, Any]) -> None:
    hosts, per_host = int(cfg["hosts"]), int(cfg["per_host"])
    shots = Path(str(cfg["shots"]))
    name = f"scale-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory(prefix="scale-views-") as tmp:
        root, config = Path(tmp) / "lab", Path(tmp) / "config"
        root.mkdir()
        install(prefix=str(Path(tmp) / "kernel"))
        env = {
            **os.environ,
            "JUPYTER_PATH": str(Path(tmp) / "kernel" / "share" / "jupyter"),
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_RUNTIME_DIR": str(config / "runtime"),
        }
        args = ("--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate")
        up = f"procs = %mesh up {name} --procs {per_host} --slurm nodes={hosts},partition={cfg['partition']}"
        again = f"procs = %mesh attach {name}\n%mesh status"
        _notebook(root / "scale.ipynb", [up, CELL, PULL, again])
        try:
            with (
                jupyter_servers.jupyter_server("jupyterlab", root, env, args) as (server, token),
                _opened(
                    f"{server}?token={token}", "lab/tree", "scale.ipynb", str(shots / "scale-inspector")
                ) as page,
            ):
                _check(page, f"{server}?token={token}", name, hosts, per_host, shots)
        finally:
            down = [sys.executable, "-m", "monarch_kernel", "down", name]
            subprocess.run(down, env=env, check=False, capture_output=True)
    print(
        f"the inspector and the panel showed {hosts * per_host} ranks on {hosts} hosts; screenshots in {shots}"
    )


def _check(page: Any, url: str, name: str, hosts: int, per_host: int, shots: Path) -> None:
    """Runs the notebook's cells and checks both views (the module's list)."""
    from playwright.sync_api import expect

    n = hosts * per_host
    cells = page.locator(".jp-Notebook .jp-Cell")
    cells.first.locator(".cm-content").click(timeout=60_000)
    page.keyboard.press("Shift+Enter")
    inspector = cells.first.locator(".monarch-inspector")
    expect(inspector.locator(".monarch-cell")).to_have_count(n, timeout=UP_MS)
    groups = inspector.locator(".monarch-host")
    expect(groups).to_have_count(hosts, timeout=30_000)
    for h in (1, hosts - 1):  # SLURM's node order: h2 before h10
        expect(groups.nth(h)).to_contain_text(re.compile(rf"host h{h + 1}\s"))
    summaries = inspector.locator(".monarch-host-summary")
    for h in (0, hosts - 1):
        expect(summaries.nth(h)).to_contain_text(f"{per_host}/{per_host} alive", timeout=60_000)
    rank = n // 2 + 1  # a rank in the middle, not its host's first
    cell = inspector.locator(f'.monarch-cell[data-rank="{rank}"]')
    expect(cell).to_have_attribute("title", re.compile(rf"^rank {rank} · alive · pid \d+"), timeout=30_000)
    pid = int(re.search(r"pid (\d+)", cell.get_attribute("title") or "").group(1))  # type: ignore[union-attr]
    cell.click()  # details on demand: its logs and stacks
    expect(inspector.locator(".monarch-detail")).to_contain_text("Thread", timeout=60_000)
    _shot(page, shots / "scale-inspector-live.png")
    _cells(page, n)
    _shot(page, shots / "scale-mesh-cell.png")

    # A new kernel reattaches: its status is a summary, and its inspector is live.
    _restart_kernel(url)
    cells.nth(3).locator(".cm-content").click(timeout=30_000)
    page.keyboard.press("Shift+Enter")
    again = cells.nth(3).locator(".jp-OutputArea-output").first
    expect(again).to_contain_text(f"attached to mesh '{name}' (epoch", timeout=120_000)
    expect(again).to_contain_text(f"{n:,} procs on {hosts} hosts: {n:,} alive", timeout=60_000)
    inspector = cells.nth(3).locator(".monarch-inspector")
    expect(inspector.locator(".monarch-cell")).to_have_count(n, timeout=60_000)

    page.locator('.jp-SideBar [data-id="monarch-meshes"]').click(timeout=30_000)
    mesh = page.locator(f'.monarch-panel .monarch-mesh[data-mesh="{name}"]')
    expect(mesh.locator(".monarch-cell")).to_have_count(n, timeout=60_000)
    expect(mesh).to_contain_text(f"{n}/{n} procs alive", timeout=60_000)
    width = page.locator(".monarch-panel").evaluate("el => [el.clientWidth, el.scrollWidth]")
    assert width[1] <= width[0], f"the panel scrolls sideways at its default width: {width}"
    os.kill(pid, signal.SIGKILL)  # the test hosts share this machine's pids
    for view in (mesh, inspector):
        dead = view.locator(f'.monarch-cell[data-rank="{rank}"]')
        expect(dead).to_have_attribute("data-state", "dead", timeout=30_000)
    mesh.locator(f'.monarch-cell[data-rank="{rank}"]').click()
    expect(mesh.locator(".monarch-detail")).to_contain_text(f"rank {rank} · dead", timeout=30_000)
    _shot(page, shots / "scale-panel.png")


def _shot(page: Any, path: Path) -> None:
    """A screenshot, with JupyterLab's own news toast closed first."""
    news = page.locator(".jp-Notification-Toast-Close")
    if news.count():
        news.first.click()
        news.first.wait_for(state="detached", timeout=10_000)
    page.screenshot(path=str(path))


def _restart_kernel(url: str) -> None:
    """Restarts the notebook's kernel (its server's REST API, as Kernel > Restart
    does) and waits until the new one is idle."""
    base, token = url.split("?token=")
    with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=10) as r:
        kernel = next(s["kernel"]["id"] for s in json.load(r) if s.get("path") == "scale.ipynb")
    restart = urllib.request.Request(f"{base}/api/kernels/{kernel}/restart?token={token}", method="POST")
    urllib.request.urlopen(restart, timeout=60).close()
    _wait_for_idle_kernel(url, "scale.ipynb", timeout=120)


def _cells(page: Any, n: int) -> None:
    """A ``%%mesh`` cell on every rank shows its output merged, each line once with
    the ranks that printed it, each rank's own output folded under it; ``%mesh pull``
    brings a value from every rank."""
    from playwright.sync_api import expect

    cells = page.locator(".jp-Notebook .jp-Cell")
    cells.nth(1).locator(".cm-content").click(timeout=30_000)
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
    merged = cells.nth(1).locator(".jp-OutputArea-output", has_text="loss 0.31")
    expect(merged).to_contain_text(f"[ranks 0-{n - 1}] loss 0.31", timeout=120_000)
    expect(merged).to_have_count(1)  # one display, not a block per rank (the rest: the wait's bar)
    expect(merged).to_contain_text("[rank 0] rank 0 saved the checkpoint")
    merged.locator("summary").click()  # each rank's own output, on demand
    expect(merged.locator("details")).to_contain_text(re.compile(rf"\[rank {n - 1}\]\s+loss 0\.31"))
    pulled = cells.nth(2).locator(".jp-OutputArea-output")
    expect(pulled).to_contain_text(f"({n}, {n * (n - 1)})", timeout=120_000)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
