"""Every notebook in notebooks/ executes cleanly through the monarch kernel (nbclient),
and the script tour runs; the quickstart shows what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _execute(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name="monarch", timeout=300, allow_errors=False).execute(cwd=str(ROOT))
    return nb


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append(out["data"].get("text/plain", ""))
        elif out["output_type"] == "error":
            parts.append("\n".join(out["traceback"]))
    return "\n".join(parts)


def test_there_are_notebooks():
    assert any(p.name == "quickstart.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_notebook_executes_through_the_monarch_kernel(jupyter_path, path):
    nb = _execute(path)
    for cell in nb.cells:
        if cell.cell_type == "code" and "raises-exception" not in cell.metadata.get("tags", []):
            assert not any(o["output_type"] == "error" for o in cell.outputs), _text(cell)


def test_the_quickstart_shows_calls_spmd_errors_and_a_mesh_outliving_its_controller(jupyter_path):
    nb = _execute(ROOT / "notebooks" / "quickstart.ipynb")
    text = [_text(c) for c in nb.cells if c.cell_type == "code"]
    everything = "\n".join(text)
    assert "mesh 'quickstart' up: 4 procs" in text[0]
    assert "[quickstart 1] rank 1 is at 12" in text[1]  # worker output in the calling cell
    assert "[rank 3]\nhello from pid" in everything and "Out: 9" in everything  # %%mesh blocks
    assert "return 100 / x" in everything and "ZeroDivisionError" in everything  # remote source line
    assert "undefined_name + 1" in everything and "--- rank 3 ---" in everything
    assert "another process sees: [" in everything
    assert "attached to mesh 'quickstart'" in everything
    assert "stopped quickstart" in text[-1]


def test_the_script_tour_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "demo" / "tour.py")], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "other process: counter state continued -> [102, 102]" in out.stdout
    assert "this process was fenced" in out.stdout
