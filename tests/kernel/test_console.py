"""The monarch kernel in a terminal: a real ``jupyter console --kernel monarch``
(its simple prompt, under pexpect) shows all a ``%%mesh`` cell's output, and what
workers print during a call, as text (CLIENTS-1): the console prints each display
once and ignores updates of it, so the kernel sends such a client each output once,
as it comes, and every display with a text/plain of its own."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from kernel_harness import TALKER
from proc_helpers import Terminal

from monarch_kernel.controller import stop_record
from monarch_kernel.hosts import _registry

pytestmark = pytest.mark.slow

#: Generous for a loaded 2-core machine: a kernel start, a mesh up, a cell.
TIMEOUT = 180
PROMPT = r"\nIn \[\d+\]: "
#: What a display without a text/plain of its own shows in a terminal.
OBJECT_REPR = re.compile(r"<[\w.]+ object( at 0x[0-9a-f]+)?>")


class Console:
    """``jupyter console`` with its simple prompt: one line per cell."""

    def __init__(self) -> None:
        jupyter = str(Path(sys.executable).with_name("jupyter"))
        args = ["console", "--kernel", "monarch", "--simple-prompt"]
        args += [f"--ZMQTerminalInteractiveShell.kernel_timeout={TIMEOUT}"]
        env = {**os.environ, "TERM": "dumb"}
        self.term = Terminal([jupyter, *args], env=env, timeout=TIMEOUT, rows=50, cols=1000)
        self.child = self.term.screen
        self.child.expect(PROMPT)
        self.kernel_pid: int | None = None

    def run(self, line: str) -> str:
        """Runs one line as a cell; what the console printed for it, up to the next
        prompt (the line's echo left out)."""
        self.child.sendline(line)
        try:
            self.child.expect(PROMPT)
        except pexpect.TIMEOUT:
            raise AssertionError(
                f"no prompt {TIMEOUT} s after {line!r}; the console showed:\n{self.child.before!s}"
            ) from None
        text = str(self.child.before).replace("\r\n", "\n")
        return text.split("\n", 1)[1] if "\n" in text else ""

    def close(self) -> None:
        """Exits the console, which shuts its kernel down; a console or kernel that
        does not go is killed."""
        try:
            if self.term.proc.poll() is None:
                self.child.sendline("exit")
                self.term.proc.wait(60)
        except (subprocess.TimeoutExpired, OSError):
            pass
        finally:
            self.term.close(signal.SIGKILL)
            if self.kernel_pid is not None:
                try:
                    os.kill(self.kernel_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def console(jupyter_path: None, state_home: Path) -> Iterator[Console]:
    c = Console()
    try:
        out = c.run("import os; os.getpid()")
        # jupyter_console can end its wait for the first cell's output early (a late
        # status of its own startup request, kernel_info, reads as the cell's "idle"
        # on a loaded machine) and show the result at the next prompt: an empty line
        # shows what it holds, as a user pressing Enter would see it.
        for _ in range(5):
            if found := re.findall(r"Out\[\d+\]: (\d+)", out):
                break
            out += c.run("")
        assert found, f"the console never showed the first cell's result: {out!r}"
        c.kernel_pid = int(found[-1])
        yield c
    finally:
        c.close()


@pytest.fixture
def mesh_name(state_home: Path) -> Iterator[str]:
    """A name for the test's mesh, stopped at the end as an administrator (whatever
    became of the console)."""
    name = f"console-{uuid.uuid4().hex[:6]}"
    yield name
    rec = _registry.read(name)
    if rec is not None:
        stop_record(rec)


def _mesh_cell(body: str, options: str = "") -> str:
    """A ``%%mesh`` cell as one line (the simple prompt takes one line a cell)."""
    return f"get_ipython().run_cell_magic('mesh', {options!r}, {body!r})"


@pytest.mark.xfail(
    reason="open: after tests/integration in one session the console shows nothing of its first cell "
    "for 180 s (reproduced: tests/integration then this file; alone, or after tests/browser and "
    "tests/k8s, it passes); the cause is not found yet",
    strict=False,
)
def test_jupyter_console_shows_every_line_each_rank_prints_and_no_object_reprs(console, mesh_name):
    up = console.run(f"procs = %mesh up {mesh_name} --procs 2")
    assert f"mesh '{mesh_name}' up: 2 procs" in up, up

    # Each rank prints, waits well past the second after which a cell shows progress,
    # and prints again: the later lines come after the first ones were shown.
    body = "import time\nprint('first', flush=True)\ntime.sleep(2.5)\nprint('second', flush=True)\n'done'"
    cell = console.run(_mesh_cell(body))
    for rank in (0, 1):
        for line in ("first", "second", "Out: 'done'"):
            assert f"[rank {rank}] {line}" in cell, cell
    assert cell.index("[rank 0] first") < cell.index("[rank 0] second")
    assert f"%%mesh on {mesh_name}: 0/2 done" in cell, cell  # the progress bar's words
    assert not OBJECT_REPR.search(cell), cell

    # Merged lines (each once, with the ranks that printed it) show as the cell ends.
    merged = console.run(_mesh_cell(body, "--group-outputs merge"))
    assert "[ranks 0-1] first" in merged and "[ranks 0-1] second" in merged, merged
    assert "[ranks 0-1] Out: 'done'" in merged, merged

    # A display a worker updates shows each state, once.
    shown = console.run(
        _mesh_cell("from IPython.display import display\nh = display('v1', display_id=True)\nh.update('v2')")
    )
    assert shown.count("'v1'") == 2 and shown.count("'v2'") == 2, shown

    # What an endpoint prints during a call that waits past a second (progress shows).
    assert "Out[" not in console.run(f"exec({TALKER!r})")
    assert "Out[" not in console.run("talker = procs.spawn('talker', Talker)")
    call = console.run("talker.say.call('slow words', delay=2.5).get()")
    assert f"[{mesh_name} 0] slow words" in call and f"[{mesh_name} 1] slow words" in call, call
    assert "call(s)" in call, call  # the progress bar's words
    assert not OBJECT_REPR.search(call), call

    assert f"stopped {mesh_name}" in console.run(f"%mesh down {mesh_name}")
