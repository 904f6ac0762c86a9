"""The mesh inspector in a real browser: JupyterLab 4 and Notebook 7 served from this venv, driven in
Debian's headless Chromium by Playwright. The widget shows the procs of a mesh that
``%mesh up`` started, clicking a proc shows its logs and stacks, and a proc turns to
dead within seconds of a kill -9, while the kernel is idle.

``make test`` installs Debian's chromium; without it this test fails and says so
(set MONARCH_SKIP_BROWSER=1 to skip it on purpose)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jupyter_servers
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = os.environ.get("MONARCH_CHROMIUM", "/usr/bin/chromium")
# What the machine needs to start Chromium headless as root with no network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

#: Where the screenshots go (the last run's stay for a person to look at).
SHOTS = Path(os.environ.get("MONARCH_SCREENSHOTS", "/tmp"))

if os.environ.get("MONARCH_SKIP_BROWSER") == "1":
    pytest.skip("MONARCH_SKIP_BROWSER=1", allow_module_level=True)


@pytest.fixture(scope="module")
def lab(jupyter_path: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A JupyterLab server on loopback: (its base URL with the token, its root folder)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium (apt-get install chromium)"
        )
    root = tmp_path_factory.mktemp("lab")
    config = tmp_path_factory.mktemp("lab-config")
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_RUNTIME_DIR=str(config / "runtime"))
    args = ("--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate")
    with jupyter_servers.jupyter_server("jupyterlab", root, env, args) as (url, token):
        yield url + f"?token={token}", root


def _notebook(path: Path, cells: list[str]) -> None:
    nb = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None}
            for c in cells
        ],
        "metadata": {"kernelspec": {"name": "monarch", "display_name": "Monarch", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


def _wait_for_idle_kernel(url: str, notebook: str, timeout: float = 60.0) -> None:
    """Until the notebook's kernel is idle (a cell run before that is lost)."""
    base, token = url.split("?token=")
    deadline = time.monotonic() + timeout
    sessions: list[dict] = []
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=5) as r:
            sessions = json.load(r)
        if any(
            s.get("path") == notebook and (s.get("kernel") or {}).get("execution_state") == "idle"
            for s in sessions
        ):
            return
        time.sleep(0.3)
    raise AssertionError(f"the kernel of {notebook} was not idle after {timeout} s: {sessions}")


def _workspace() -> str:
    """A JupyterLab workspace of its own: the lab's last layout does not come back."""
    return f"lab/workspaces/w{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def _page(url: str, path: str, shot: str, ready: Callable[[Any], None]) -> Iterator[Any]:
    """A Chromium page at ``path`` of the server, once ``ready(page)`` returned; a
    screenshot ``shot``.png at the end (``shot``-failure.png on a failure)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            page.goto(url.replace("?", f"/{path}?"))
            ready(page)
            yield page
            page.screenshot(path=str(SHOTS / f"{shot}.png"))
        except BaseException:
            page.screenshot(path=str(SHOTS / f"{shot}-failure.png"))
            raise
        finally:
            browser.close()


def _opened(url: str, path: str, notebook: str, shot: str) -> contextlib.AbstractContextManager[Any]:
    """A Chromium page with ``notebook`` open in the front end at ``path`` and its
    kernel idle (see ``_page``)."""
    if path == "lab/tree":
        path = f"{_workspace()}/tree"

    def ready(page: Any) -> None:
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
        _wait_for_idle_kernel(url, notebook)

    return _page(url, f"{path}/{notebook}", shot, ready)


@pytest.mark.parametrize("front_end", ["lab/tree", "notebooks"], ids=["jupyterlab4", "notebook7"])
def test_the_inspector_shows_the_procs_and_a_killed_proc_turns_dead(lab, front_end):
    from playwright.sync_api import expect

    url, root = lab
    name = f"browser-{uuid.uuid4().hex[:6]}"
    notebook = f"inspect-{name}.ipynb"
    _notebook(root / notebook, [f"procs = %mesh up {name} --procs 2"])
    try:
        with _opened(url, front_end, notebook, f"inspector-{front_end.split('/')[0]}") as page:
            cell = page.locator(".jp-Notebook .jp-Cell").first
            cell.locator(".cm-content").click(timeout=60_000)
            page.keyboard.press("Shift+Enter")
            rows = page.locator(".monarch-inspector .monarch-proc")
            expect(rows).to_have_count(2, timeout=40_000)
            states = page.locator(".monarch-inspector .monarch-proc-state")
            expect(states.nth(0)).to_have_text("alive", timeout=30_000)
            expect(states.nth(1)).to_have_text("alive", timeout=30_000)
            hosts = page.locator(".monarch-inspector .monarch-host")  # the grid: procs under their host
            expect(hosts).to_have_count(1)
            expect(hosts).to_contain_text(f"host {os.uname().nodename}")
            pids = [int(rows.nth(i).locator("td").nth(2).inner_text()) for i in range(2)]
            assert all(pid > 0 for pid in pids)

            rows.nth(0).click()  # a proc's recent logs and stacks
            detail = page.locator(".monarch-inspector .monarch-detail")
            expect(detail).to_contain_text("Thread", timeout=30_000)

            os.kill(pids[1], signal.SIGKILL)
            killed = time.monotonic()
            expect(page.locator('.monarch-proc[data-rank="1"] .monarch-proc-state')).to_have_text(
                "dead", timeout=10_000
            )
            seen = time.monotonic() - killed
            expect(page.locator('.monarch-proc[data-rank="0"] .monarch-proc-state')).to_have_text("alive")
            print(f"rank 1 shown dead {seen:.2f} s after kill -9")
    finally:
        subprocess.run(
            [sys.executable, "-m", "monarch_kernel", "down", name], check=False, capture_output=True
        )


def test_a_mesh_cell_shows_a_worker_plot_and_one_progress_widget_per_rank_in_jupyterlab(lab):
    # Issue 17 in a real front end: rank 0's matplotlib figure renders as an <img>
    # after rank 0's block, and each rank's tqdm.auto bar is one live progress widget.
    from playwright.sync_api import expect

    url, root = lab
    name = f"browser-{uuid.uuid4().hex[:6]}"
    notebook = f"cells-{name}.ipynb"
    cell = (
        "%%mesh\nimport time\nfrom tqdm.auto import tqdm\nimport matplotlib.pyplot as plt\n"
        "from monarch_kernel import current_rank\n"
        "for _ in tqdm(range(30), desc=f'bar {current_rank().rank}', mininterval=0.02):\n"
        "    time.sleep(0.01)\n"
        "if current_rank().rank == 0:\n    plt.plot([3, 1, 2])\n    plt.show()"
    )
    _notebook(root / notebook, [f"procs = %mesh up {name} --procs 2", cell])
    try:
        with _opened(url, "lab/tree", notebook, "mesh-cell-rich-output") as page:
            page.locator(".jp-Notebook .jp-Cell").first.locator(".cm-content").click(timeout=60_000)
            for _ in range(2):
                page.keyboard.press("Shift+Enter")
            outputs = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output")
            image = outputs.locator("img")
            expect(image).to_have_count(1, timeout=60_000)
            texts = [outputs.nth(i).inner_text() for i in range(outputs.count())]
            img_at = next(i for i in range(outputs.count()) if outputs.nth(i).locator("img").count())
            assert any(t.startswith("[rank 0]") for t in texts[:img_at]), texts
            # tqdm.auto takes its notebook form on the workers (DISPLAY-2): one progress
            # widget per rank, rendered by JupyterLab from the bridged models, at 30/30.
            bars = outputs.locator(".widget-hprogress")
            expect(bars).to_have_count(2, timeout=30_000)
            for r in range(2):
                expect(outputs.filter(has_text=f"bar {r}")).to_contain_text("30/30", timeout=30_000)
    finally:
        subprocess.run(
            [sys.executable, "-m", "monarch_kernel", "down", name], check=False, capture_output=True
        )


def _panel_notebook(root: Path, name: str) -> str:
    notebook = f"panel-{name}.ipynb"
    _notebook(root / notebook, ["1 + 1"])
    return notebook


def _kill_and_see(page: Any, mesh: Any, rank: int) -> None:
    """kill -9 of the worker of ``rank``, seen dead (its signal named) in the panel."""
    from playwright.sync_api import expect

    row = mesh.locator(f'.monarch-rank[data-rank="{rank}"]')
    pid = int(row.locator("td").nth(2).inner_text())
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    expect(row.locator(".monarch-rank-state")).to_contain_text("dead (SIGKILL)", timeout=10_000)
    print(f"the panel showed rank {rank} dead {time.monotonic() - killed:.2f} s after kill -9")


def test_the_meshes_panel_lists_a_mesh_shows_a_kill_respawns_attaches_tails_logs_and_downs_it(lab, tmp_path):
    # Issue 18: the Meshes side panel, from the server extension's live events.
    from playwright.sync_api import expect

    url, root = lab
    with (
        jupyter_servers.script_mesh(tmp_path) as name,
        _opened(url, "lab/tree", _panel_notebook(root, name), "meshes-panel") as page,
    ):
        notebook = f"panel-{name}.ipynb"
        page.locator('.jp-SideBar [data-id="monarch-meshes"]').click(timeout=30_000)
        mesh = page.locator(f'.monarch-panel .monarch-mesh[data-mesh="{name}"]')
        expect(mesh).to_contain_text("2/2 procs alive", timeout=30_000)
        expect(mesh.locator('.monarch-rank[data-rank="0"] .monarch-mem')).to_contain_text(
            "MiB", timeout=30_000
        )  # each proc's memory, measured by the worker
        expect(page.locator(".monarch-status")).to_contain_text("procs 2/2", timeout=30_000)
        # The script that made it has gone: nobody holds it, and its idle clock runs.
        expect(mesh.locator(".monarch-owner")).to_have_text("no controller")
        expect(mesh.locator(".monarch-idle")).to_contain_text("stops in")
        respawn = mesh.locator('button[data-action="respawn"]')
        expect(respawn).to_be_disabled()

        _kill_and_see(page, mesh, 1)
        expect(mesh.locator(".monarch-mesh-state")).to_have_text("degraded")
        page.screenshot(path=str(SHOTS / "meshes-panel-live.png"))  # (the README's picture)
        respawn.click()  # nobody holds it: as an administrator
        expect(mesh.locator(".monarch-note")).to_contain_text("respawned ranks 1", timeout=60_000)
        expect(mesh).to_contain_text("2/2 procs alive", timeout=30_000)

        page.locator(".jp-Notebook .jp-Cell").first.locator(".cm-content").click(timeout=30_000)
        mesh.locator('button[data-action="attach"]').click()
        attached = page.locator(".jp-Notebook .jp-Cell").nth(1)
        expect(attached.locator(".cm-content")).to_contain_text(
            f"procs = %mesh attach {name}", timeout=30_000
        )
        expect(attached.locator(".jp-OutputArea")).to_contain_text(name, timeout=60_000)
        expect(mesh.locator(".monarch-owner")).to_have_text(f"held by kernel of {notebook}", timeout=30_000)
        expect(mesh.locator(".monarch-idle")).to_have_text("")  # held: no idle clock

        _kill_and_see(page, mesh, 0)
        respawn.click()  # held by the notebook's kernel: it respawns, its actors too
        expect(mesh.locator(".monarch-note")).to_contain_text("respawned ranks 0", timeout=60_000)
        expect(mesh).to_contain_text("2/2 procs alive", timeout=30_000)

        mesh.locator('button[data-action="logs"]').click()
        logs = page.locator(".monarch-logs")
        expect(logs).to_contain_text("said from the script", timeout=30_000)
        # A line printed after the tab opened shows in it (the notebook prints it).
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=notebook).click()
        first = page.locator(".jp-Notebook .jp-Cell").first
        first.locator(".cm-content").click()
        page.keyboard.press("Control+a")
        page.keyboard.type(f"%%mesh {name}\nprint('printed after the logs tab opened')")
        page.keyboard.press("Shift+Enter")
        expect(first.locator(".jp-OutputArea")).to_contain_text("printed after", timeout=60_000)
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=f"Logs: {name}").click()
        expect(logs).to_contain_text("[rank 0] printed after the logs tab opened", timeout=30_000)
        page.locator(".monarch-logs-rank").fill("1")  # one rank's lines only
        expect(logs).not_to_contain_text("[rank 0]", timeout=10_000)
        expect(logs).to_contain_text("[rank 1] printed after the logs tab opened")

        mesh.locator('button[data-action="stacks"]').click()
        expect(page.locator(".monarch-logs").last).to_contain_text("--- rank 0 ---", timeout=30_000)
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=f"Stacks: {name}").locator(
            ".lm-TabBar-tabCloseIcon"
        ).click()
        # Stacks again from the command palette, which asks for the mesh.
        page.keyboard.press("Control+Shift+C")
        page.keyboard.type("Monarch: Stacks of a mesh")
        page.keyboard.press("Enter")
        page.locator(".jp-Dialog select").select_option(name, timeout=30_000)
        page.locator(".jp-Dialog .jp-mod-accept").click()
        expect(page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=f"Stacks: {name}")).to_have_count(
            1, timeout=30_000
        )
        expect(page.locator(".monarch-logs").last).to_contain_text("--- rank 0 ---", timeout=30_000)

        mesh.locator('button[data-action="down"]').click()
        page.locator(".jp-Dialog .jp-mod-warn").click(timeout=30_000)
        expect(page.locator(f'.monarch-panel .monarch-mesh[data-mesh="{name}"]')).to_have_count(
            0, timeout=30_000
        )


def _panel_page(url: str, shot: str) -> contextlib.AbstractContextManager[Any]:
    """A Chromium page with JupyterLab open (no notebook) and the Meshes panel shown
    (see ``_page``)."""
    return _page(
        url,
        _workspace(),
        shot,
        lambda page: page.locator('.jp-SideBar [data-id="monarch-meshes"]').click(timeout=60_000),
    )


def test_attach_from_the_panel_with_no_monarch_notebook_open_starts_one_attached(lab, tmp_path):
    # Issue 18: "runs procs = %mesh attach NAME in the active notebook's monarch
    # kernel, or offers to start one".
    from playwright.sync_api import expect

    url, root = lab
    try:
        with (
            jupyter_servers.script_mesh(tmp_path) as name,
            _panel_page(url, "meshes-panel-attach-new") as page,
        ):
            mesh = page.locator(f'.monarch-panel .monarch-mesh[data-mesh="{name}"]')
            mesh.locator('button[data-action="attach"]').click(timeout=30_000)
            page.locator(".jp-Dialog .jp-mod-accept", has_text="New notebook").click(timeout=30_000)
            cell = page.locator(".jp-Notebook .jp-Cell").first
            expect(cell.locator(".cm-content")).to_have_text(f"procs = %mesh attach {name}", timeout=60_000)
            expect(cell.locator(".jp-OutputArea")).to_contain_text(
                f"attached to mesh '{name}'", timeout=60_000
            )
            expect(mesh.locator(".monarch-owner")).to_contain_text(
                "held by kernel of Untitled", timeout=30_000
            )
    finally:
        for nb in root.glob("Untitled*.ipynb"):
            nb.unlink()


def test_respawn_from_the_panel_of_a_mesh_held_elsewhere_says_who_holds_it(lab, state_home):
    # Never a silent failure: the panel cannot respawn a mesh another controller holds
    # (this test's process), and says so, naming it.
    from playwright.sync_api import expect

    from monarch_kernel import this_host

    url, _root = lab
    name = f"held-{uuid.uuid4().hex[:6]}"
    procs = this_host().spawn_procs(per_host={"procs": 2}, name=name)
    procs.on_failure(lambda failure: None)  # the kill below is expected
    try:
        with _panel_page(url, "meshes-panel-respawn-refused") as page:
            mesh = page.locator(f'.monarch-panel .monarch-mesh[data-mesh="{name}"]')
            expect(mesh.locator(".monarch-owner")).to_contain_text(f"pid {os.getpid()}", timeout=30_000)
            pid = int(mesh.locator('.monarch-rank[data-rank="1"] td').nth(2).inner_text())
            os.kill(pid, signal.SIGKILL)
            respawn = mesh.locator('button[data-action="respawn"]')
            expect(respawn).to_be_enabled(timeout=10_000)
            respawn.click()
            dialog = page.locator(".jp-Dialog")
            expect(dialog).to_contain_text(f"Could not respawn {name}", timeout=30_000)
            expect(dialog).to_contain_text(f"is held by pid {os.getpid()} on")
            expect(dialog).to_contain_text(f"(procs.respawn() or %mesh respawn {name})")
            dialog.locator("button", has_text="Close").click()
            expect(mesh.locator(".monarch-note")).to_have_text("the respawn failed")
            assert procs.status()[0] == "alive"  # still this process's, not fenced
    finally:
        procs.stop()


def test_a_large_mesh_is_a_grid_by_host_in_the_inspector_and_the_panel(lab):
    # Issue 27: from 33 procs on, a cell per rank grouped by host, coloured by state,
    # details on hover and click; a killed rank's cell turns dead in both views.
    from playwright.sync_api import expect

    url, root = lab
    name = f"browser-{uuid.uuid4().hex[:6]}"
    notebook = f"grid-{name}.ipynb"
    _notebook(root / notebook, [f"procs = %mesh up {name} --procs 40"])
    try:
        with _opened(url, "lab/tree", notebook, "inspector-grid") as page:
            page.locator(".jp-Notebook .jp-Cell").first.locator(".cm-content").click(timeout=60_000)
            page.keyboard.press("Shift+Enter")
            cells = page.locator(".monarch-inspector .monarch-cell")
            expect(cells).to_have_count(40, timeout=90_000)
            expect(page.locator(".monarch-inspector table")).to_have_count(0)
            host = page.locator(".monarch-inspector .monarch-host")
            expect(host).to_have_count(1)
            expect(host.locator(".monarch-host-summary")).to_contain_text("40/40 alive", timeout=30_000)
            third = page.locator('.monarch-inspector .monarch-cell[data-rank="3"]')
            expect(third).to_have_attribute("title", re.compile(r"^rank 3 · alive · pid \d+"), timeout=30_000)
            pid = int(re.search(r"pid (\d+)", third.get_attribute("title") or "").group(1))  # type: ignore[union-attr]
            third.click()  # details on demand: its logs and stacks
            expect(page.locator(".monarch-inspector .monarch-detail")).to_contain_text(
                "Thread", timeout=30_000
            )

            page.locator('.jp-SideBar [data-id="monarch-meshes"]').click(timeout=30_000)
            mesh = page.locator(f'.monarch-panel .monarch-mesh[data-mesh="{name}"]')
            expect(mesh.locator(".monarch-cell")).to_have_count(40, timeout=30_000)
            expect(mesh.locator("table")).to_have_count(0)
            panel = page.locator(".monarch-panel")
            width = panel.evaluate("el => [el.clientWidth, el.scrollWidth]")
            assert width[1] <= width[0], f"the panel scrolls sideways at its default width: {width}"
            os.kill(pid, signal.SIGKILL)
            expect(mesh.locator('.monarch-cell[data-rank="3"]')).to_have_attribute(
                "data-state", "dead", timeout=30_000
            )
            expect(page.locator('.monarch-inspector .monarch-cell[data-rank="3"]')).to_have_attribute(
                "data-state", "dead", timeout=30_000
            )
            mesh.locator('.monarch-cell[data-rank="3"]').click()
            expect(mesh.locator(".monarch-detail")).to_contain_text("rank 3 · dead", timeout=10_000)
            page.screenshot(path=str(SHOTS / "meshes-panel-grid.png"))
    finally:
        subprocess.run(
            [sys.executable, "-m", "monarch_kernel", "down", name], check=False, capture_output=True
        )
