"""``shell`` (``monarch_kernel.job``, Monarch's): a script run in a terminal (a pty,
read and typed into with pexpect) opens a shell on ``this_host()`` through a proc of
its own, types into it, and gets its exit status back; the terminal is put back and
the proc stopped, also when the script is ended by SIGTERM. Where stdin is no
terminal, it refuses before starting anything."""

from __future__ import annotations

import signal
import subprocess
import sys
import termios
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from proc_helpers import Terminal

from monarch_kernel import this_host
from monarch_kernel.errors import MeshSpecError
from monarch_kernel.hosts import registry
from monarch_kernel.job import SSHJob, shell

TIMEOUT = 120
PROMPT = "remote$ "

SCRIPT = f"""
import sys, termios
from monarch_kernel import this_host
from monarch_kernel.job import shell

before = termios.tcgetattr(0)
status = shell(this_host(), env={{"SHELL": "/bin/sh", "PS1": {PROMPT!r}}})
print("terminal restored:", termios.tcgetattr(0) == before)
print(f"status={{status}}")
sys.exit(status)
"""


@dataclass
class ShellScript:
    """The script, running with a pty as its terminal: ``screen`` reads and types
    (pexpect, on the pty's master), ``script`` is its process."""

    screen: Any
    script: subprocess.Popen[bytes]
    #: The meshes there were before the script started.
    meshes_before: set[str]

    def cooked(self) -> bool:
        """Whether the terminal is as a shell leaves it: line editing and echo on (the
        master's termios are the terminal's)."""
        lflag = termios.tcgetattr(self.screen.child_fd)[3]
        return bool(lflag & termios.ICANON and lflag & termios.ECHO)


@pytest.fixture
def terminal(state_home: Path, tmp_path: Path) -> Iterator[ShellScript]:
    """The script above in a terminal of its own (``proc_helpers.Terminal``: not a
    plain fork of this process, which uses grpc); ended with SIGTERM if a test leaves
    it running (which stops its proc)."""
    script = tmp_path / "remote_shell.py"
    script.write_text(SCRIPT)
    before = set(registry.names())
    term = Terminal([sys.executable, str(script)], timeout=TIMEOUT)
    term.screen.logfile_read = sys.stdout  # all the terminal showed, in the report of a failure
    try:
        yield ShellScript(term.screen, term.proc, before)
    finally:
        print(f"\nthe script ended: {term.close(within=TIMEOUT)}")


def test_a_shell_on_this_host_runs_what_is_typed_and_returns_its_exit_status(terminal):
    terminal.screen.expect_exact(PROMPT)
    terminal.screen.sendline("echo $((6*7)); exit 3")
    terminal.screen.expect("\r\n42\r\n")
    terminal.screen.expect_exact("terminal restored: True")
    terminal.screen.expect_exact("status=3")
    assert terminal.script.wait(TIMEOUT) == 3
    assert set(registry.names()) == terminal.meshes_before  # its proc was stopped


def test_sigterm_ends_the_shell_restores_the_terminal_and_stops_its_proc(terminal):
    terminal.screen.expect_exact(PROMPT)
    assert set(registry.names()) > terminal.meshes_before  # the shell's proc
    assert not terminal.cooked()  # raw, while the remote shell has it
    terminal.script.send_signal(signal.SIGTERM)
    assert terminal.script.wait(TIMEOUT) == -signal.SIGTERM
    assert terminal.cooked()
    assert set(registry.names()) == terminal.meshes_before


def test_without_a_terminal_shell_refuses_before_starting_anything(state_home):
    before = set(registry.names())
    with pytest.raises(MeshSpecError, match="terminal"):
        shell(this_host())  # pytest's stdin is no terminal
    assert set(registry.names()) == before


def test_a_host_mesh_of_several_hosts_is_refused(state_home):
    hosts = SSHJob(hosts=["node-a", "node-b"]).state(cached_path=None).hosts
    with pytest.raises(ValueError, match="one host"):
        shell(hosts)
