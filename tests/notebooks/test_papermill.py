"""The quickstart under papermill, as a user runs it: ``papermill quickstart.ipynb
out.ipynb -k monarch`` exits 0 (papermill fails a run on any cell's error output,
whatever the cell's tags), and the cells that show what an error looks like still
show it: the remote traceback of an endpoint, each failed rank's of a ``%%mesh``
cell."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from notebook_text import cell_text

from monarch_kernel.controller import stop_record
from monarch_kernel.hosts import _registry

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "notebooks" / "quickstart.ipynb"


@pytest.fixture
def quickstart_mesh(state_home: Path) -> Iterator[str]:
    """The quickstart's mesh, stopped at the end as an administrator if the notebook
    did not get to its last cell."""
    yield "quickstart"
    rec = _registry.read("quickstart")
    if rec is not None:
        stop_record(rec)


def test_papermill_runs_the_quickstart_to_its_end_and_its_error_cells_show_their_errors(
    jupyter_path, quickstart_mesh, tmp_path
):
    out = tmp_path / "out.ipynb"
    papermill = str(Path(sys.executable).with_name("papermill"))
    run = subprocess.run(
        [papermill, str(QUICKSTART), str(out), "-k", "monarch", "--no-progress-bar"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(tmp_path),
    )
    assert run.returncode == 0, run.stderr[-4000:]

    nb = nbformat.read(out, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not [o for c in code for o in c.outputs if o["output_type"] == "error"]
    assert "stopped quickstart" in cell_text(code[-1])  # it ran to its end

    call = cell_text(next(c for c in code if "class Fragile" in c.source))
    assert "Traceback of where the remote call failed" in call, call
    assert "return 100 / x" in call and "ZeroDivisionError" in call, call  # the worker's source line

    cell = cell_text(next(c for c in code if "undefined_name + 1" in c.source))
    assert "1 of 1 ranks failed; rank 3: NameError" in cell, cell
    assert "--- rank 3 ---" in cell and "undefined_name + 1" in cell, cell
