"""DEBUG-3 with real workers and a real terminal: a script's ``breakpoint()`` waits
in pdb, ``monarch-kernel debug`` (another process) lists it and debugs it under a
pty, and the script goes on with its mesh; one command continues many ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from proc_helpers import Terminal, wait_for

TIMEOUT = 60

SCRIPT = """
import sys
from monarch_kernel import Actor, current_rank, endpoint, this_host

class Stopper(Actor):
    @endpoint
    def step(self, stop_on):
        x = 41 + current_rank()["procs"]
        if current_rank()["procs"] in stop_on:
            breakpoint()
        return x + 1

procs = this_host().spawn_procs(per_host={{"procs": 3}}, name={name!r})
try:
    got = procs.spawn("stopper", Stopper).step.call({stop_on!r}).get(timeout=120).values()
    print("got", got, flush=True)
    print("status", procs.status(), flush=True)  # still this script's mesh: not fenced
finally:
    procs.stop()
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monarch_kernel", "debug", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=dict(os.environ),
    )


def _start(tmp_path: Path, stop_on: list[int]) -> tuple[str, subprocess.Popen[str]]:
    name = f"dbg-{uuid.uuid4().hex[:6]}"
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT.format(name=name, stop_on=stop_on)))
    env = dict(os.environ)
    env.pop("MONARCH_FORWARD_OUTPUT", None)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    return name, proc


def _end(name: str, script: subprocess.Popen[str]) -> None:
    """Ends the script if it still runs, and its mesh with it (a named mesh outlives
    a script that is killed)."""
    if script.poll() is None:
        script.kill()
        script.communicate()
        subprocess.run(
            [sys.executable, "-m", "monarch_kernel", "down", name], capture_output=True, timeout=TIMEOUT
        )


def _waiting(name: str, ranks: list[int]) -> str:
    """What ``monarch-kernel debug NAME`` lists once every rank of ``ranks`` waits."""

    def listed() -> str | None:
        out = _cli(name).stdout
        return out if all(f"[{name} {r}] waiting in pdb" in out for r in ranks) else None

    return str(wait_for(listed, within=TIMEOUT, every=0.3))


def test_a_scripts_breakpoint_waits_and_a_terminal_debugs_it_while_the_script_keeps_its_mesh(
    state_home, tmp_path
):
    name, script = _start(tmp_path, [1])
    try:
        listed = _waiting(name, [1])
        assert "script.py:" in listed and f"monarch-kernel debug {name} --rank 1" in listed
        assert f"[{name} 0]" not in listed
        term = Terminal(
            [sys.executable, "-m", "monarch_kernel", "debug", name, "--rank", "1"], timeout=TIMEOUT
        )
        try:
            screen = term.screen
            screen.expect(rf"\[{name} 1\] \(Pdb\) ")
            screen.sendline("p x * 10")
            screen.expect("420")
            screen.expect(rf"\[{name} 1\] \(Pdb\) ")
            screen.sendline("c")
            screen.expect("runs on")
            assert term.proc.wait(TIMEOUT) == 0
        finally:
            term.close()
        out, err = script.communicate(timeout=TIMEOUT)
        assert script.returncode == 0, err
        assert "got [42, 43, 44]" in out
        assert "status ['alive', 'alive', 'alive']" in out
        assert f"rank 1 of mesh '{name}' waits in pdb at breakpoint()" in out + err
    finally:
        _end(name, script)


def test_one_command_reaches_every_parked_rank(state_home, tmp_path):
    name, script = _start(tmp_path, [0, 1, 2])
    try:
        _waiting(name, [0, 1, 2])
        sent = _cli(name, "--ranks", "0-1", "--cmd", "c")
        assert sent.returncode == 0 and "sent to rank(s) [0, 1]" in sent.stdout, sent.stdout + sent.stderr
        left = _waiting(name, [2])
        assert f"[{name} 0]" not in left and f"[{name} 1]" not in left
        assert "sent to rank(s) [2]" in _cli(name, "--cmd", "c").stdout
        out, err = script.communicate(timeout=TIMEOUT)
        assert script.returncode == 0, err
        assert "got [42, 43, 44]" in out
        assert "no rank is waiting in pdb" in _cli(name).stdout  # (the mesh is gone)
    finally:
        _end(name, script)
