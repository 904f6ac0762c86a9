"""Monarch's ``monarch.job`` helpers with real workers: ``exec_command`` on a host
mesh (exit codes, output files, environment and folder, output streamed under each
rank), and ``attach`` by the address of a mesh's host agent (Monarch's form)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from monarch_kernel import attach, this_host
from monarch_kernel.errors import MeshNotFoundError, MeshSpecError
from monarch_kernel.hosts import registry
from monarch_kernel.job import exec_command

TIMEOUT = 60


def test_exec_command_gives_the_highest_exit_code_and_leaves_no_procs(state_home):
    before = set(registry.names())
    assert exec_command(this_host(), ["sh", "-c", "exit 3"]).get(timeout=TIMEOUT) == 3
    assert exec_command(this_host(), ["true"], per_host={"procs": 2}).get(timeout=TIMEOUT) == 0
    assert set(registry.names()) == before  # its procs were stopped


def test_exec_command_runs_a_python_script_with_env_and_folder_into_files(state_home, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys\nprint(os.environ['GREETING'], os.getcwd())\nprint('oops', file=sys.stderr)\n"
    )
    out = tmp_path / "out"
    code = exec_command(
        this_host(), [str(script)], env={"GREETING": "hello"}, workdir=str(tmp_path), output_dir=str(out)
    ).get(timeout=TIMEOUT)
    assert code == 0
    assert (out / "stdout.txt").read_text() == f"hello {tmp_path}\n"
    assert (out / "stderr.txt").read_text() == "oops\n"


def test_exec_command_output_shows_under_its_rank_in_a_script(state_home, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            """
            from monarch_kernel import this_host
            from monarch_kernel.job import exec_command
            code = exec_command(this_host(), ["sh", "-c", "echo line-$MONARCH_RANK"], per_host={"procs": 2}).get()
            print("code", code)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(ln.endswith("line-0") and "0" in ln.split("line-")[0] for ln in lines), lines
    assert any(ln.endswith("line-1") and "1" in ln.split("line-")[0] for ln in lines), lines
    assert lines[-1] == "code 0"


def test_exec_command_refuses_a_command_that_is_not_a_list(state_home):
    with pytest.raises(MeshSpecError, match="non-empty list of strings"):
        exec_command(this_host(), "echo hi")  # type: ignore[arg-type]
    with pytest.raises(MeshSpecError, match="rank or point, not both"):
        exec_command(this_host(), ["true"], rank=0, point={"hosts": 0})


def test_attach_takes_the_address_of_a_meshs_agent_or_its_name(named_mesh):
    name, procs = named_mesh(2)
    addr = registry.read(name).agent_addr
    for given in (f"tcp://{addr}", addr):
        again = attach(given)
        assert again.sizes == procs.sizes
    with pytest.raises(
        MeshNotFoundError, match="no running mesh of this user has a host agent at 127.0.0.1:1"
    ):
        attach("tcp://127.0.0.1:1")
