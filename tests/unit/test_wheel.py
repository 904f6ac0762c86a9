"""The package carries the Meshes panel (issue 18): the wheel holds the prebuilt
JupyterLab extension as data for ``share/jupyter/labextensions``, so ``pip install``
gives it with no build step, and this venv's JupyterLab has it from the install of
the package (``maturin develop`` in ``make setup``), not from a copy made aside."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from monarch_kernel.kernel._install import SERVER_CONFIG

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PANEL = "monarch-kernel-panel"
LABEXTENSIONS = "share/jupyter/labextensions"


def _labextensions() -> dict[str, tuple[str, str]]:
    """``jupyter labextension list`` of this venv's JupyterLab: each extension's line
    (without colours) and the folder it is listed under."""
    listing = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found, folder = {}, ""
    for line in re.sub(r"\x1b\[[0-9;]*m", "", listing.stderr + listing.stdout).splitlines():
        if line.strip().endswith("labextensions") and not line[:1].isspace():
            folder = line.strip()
        elif line[:1].isspace() and line.split():
            found[line.split()[0]] = (line.strip(), folder)
    return found


def test_jupyterlab_has_the_panel_enabled_and_ok_from_the_install_of_the_package():
    listed = _labextensions()
    assert PANEL in listed, f"{PANEL} is not in `jupyter labextension list`: {listed}"
    line, folder = listed[PANEL]
    assert line.split()[2:4] == ["enabled", "OK"], line
    assert f"(python, {PROJECT['name']})" in line  # install.json: it comes with the Python package
    assert Path(folder) == Path(sys.prefix) / LABEXTENSIONS
    # there because the package's install put it there (its RECORD), not a copy made aside
    installed = [str(f) for f in metadata.files(PROJECT["name"]) or ()]
    assert any(f.endswith(f"{LABEXTENSIONS}/{PANEL}/package.json") for f in installed), installed


def _build_wheel(out: Path) -> Path:
    """``maturin build --release`` of the working tree. With the venv's VIRTUAL_ENV, as
    ``make setup`` runs ``maturin develop --release``, it reuses cargo's build of the
    native core (about a second here; a change to native/ since costs its rebuild)."""
    maturin = Path(sys.executable).with_name("maturin")
    if not maturin.exists():
        pytest.skip("maturin is not installed in this environment (pip install -e '.[dev]')")
    subprocess.run(
        [str(maturin), "build", "--release", "--quiet", "--out", str(out)],
        cwd=ROOT,
        env=dict(os.environ, VIRTUAL_ENV=sys.prefix),
        check=True,
        timeout=900,
    )
    (built,) = out.glob("*.whl")
    return built


@pytest.mark.timeout(1000)  # (a cold build of the native core; warm, a second)
def test_the_wheel_carries_the_prebuilt_panel_and_enables_the_server_extension(tmp_path: Path):
    name = PROJECT["name"]
    data = f"{name.replace('-', '_')}-{PROJECT['version']}.data/data"
    panel = f"{data}/{LABEXTENSIONS}/{PANEL}"
    with zipfile.ZipFile(_build_wheel(tmp_path)) as whl:
        names = whl.namelist()
        assert f"{panel}/package.json" in names, names
        package = json.loads(whl.read(f"{panel}/package.json"))
        install = json.loads(whl.read(f"{panel}/install.json"))
        # the panel's data comes from the server extension, which pip install enables
        config = json.loads(whl.read(f"{data}/etc/jupyter/jupyter_server_config.d/monarch_kernel.json"))
    assert config == SERVER_CONFIG
    assert package["name"] == PANEL
    # the script JupyterLab loads first (it loads the rest) is there
    assert f"{panel}/{package['jupyterlab']['_build']['load']}" in names
    assert re.fullmatch(r"static/remoteEntry\.[0-9a-f]+\.js", package["jupyterlab"]["_build"]["load"])
    assert install == {
        "packageManager": "python",
        "packageName": name,
        "uninstallInstructions": f"Use your Python package manager (pip, conda, etc.) to uninstall the package {name}",
    }
