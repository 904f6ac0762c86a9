"""``%%mesh`` cells that feel local (issue 17), through jupyter_client: output before
the value it preceded (CELL-1), ``\\r`` as a terminal shows it, tracebacks that name
``Cell In[n]`` with the editor's line numbers (TB-1)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _blocks(out) -> dict[str, str]:
    """The final text of each rank's block, by display id."""
    return {d: t for _kind, t, d in out.displays}


def test_what_a_rank_printed_before_returning_shows_before_its_value_on_a_loaded_machine(kernel, mesh):
    # CPU hogs on every core: the worker's output (through its agent) and its reply
    # (direct) race; the value must still come after the lines.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        for _ in range(5):
            out = kernel.run(
                "%%mesh\nfor i in range(20):\n    print('line', i)\nprint('last words')\n'the value'"
            )
            assert out.error is None, out.traceback
            for text in _blocks(out).values():
                assert text.index("last words") < text.index("Out: 'the value'"), text
                assert text.count("line ") == 20
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_carriage_returns_rewrite_the_ranks_last_line_as_a_terminal_would(kernel, mesh):
    out = kernel.run(
        "%%mesh\nimport time\n"
        "for i in range(40):\n    print(f'\\rstep {i}', end='', flush=True)\n    time.sleep(0.005)\n"
        "print()\nprint('after the bar')"
    )
    assert out.error is None, out.traceback
    for text in _blocks(out).values():
        assert "step 39" in text and "after the bar" in text
        assert text.count("step ") == 1, text  # one live line, not forty


def test_a_mesh_cell_traceback_names_cell_in_n_with_the_editors_line_numbers(kernel, mesh):
    out = kernel.run("%%mesh --ranks 0\nx = 1\ny = 2\nraise ValueError('third line of the body')")
    count = out.reply["execution_count"]
    # The %%mesh line is line 1, so the raise is line 4, as the editor numbers it.
    assert f"Cell In[{count}], line 4" in out.traceback, out.traceback
    assert "<%%mesh cell" not in out.traceback


def test_a_function_from_an_earlier_mesh_cell_names_its_own_cell_and_line(kernel, mesh):
    first = kernel.run("%%mesh --ranks 0\ndef explode(x):\n    return 1 / x")
    defined_in = first.reply["execution_count"]
    later = kernel.run("%%mesh --ranks 0\nexplode(0)")
    assert f"Cell In[{defined_in}], line 3" in later.traceback, later.traceback
    assert f"Cell In[{later.reply['execution_count']}], line 2" in later.traceback


@pytest.mark.parametrize("code", ["import sys; sys.exit(3)"])
def test_sys_exit_in_a_mesh_cell_is_an_error_of_that_cell_and_the_next_cell_runs(kernel, mesh, code):
    out = kernel.run(f"%%mesh\n{code}")
    assert "SystemExit: 3" in out.traceback
    again = kernel.run("%%mesh\n'still here'")
    assert again.error is None, again.traceback
    assert all("Out: 'still here'" in t for t in _blocks(again).values())
