"""``monarch_kernel.spmd`` with real workers: an unmodified torchrun-style script
(gloo all-reduce, reading torchrun's variables) on every proc, run again after an
edit on the same procs, a failing exit status, and Monarch's building blocks."""

from __future__ import annotations

import os
import textwrap

import pytest
from proc_helpers import logged

from monarch_kernel import Actor, endpoint, this_host
from monarch_kernel.errors import ActorError, MeshSpecError
from monarch_kernel.spmd import run_spmd, setup_torch_elastic_env

TIMEOUT = 120

SCRIPT = """
import os
import torch
import torch.distributed as dist

def main():
    dist.init_process_group("gloo")  # from MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    x = torch.tensor([float(os.environ["RANK"]) + 1]) * {factor}
    dist.all_reduce(x)
    print(f"rank {{os.environ['RANK']}}/{{os.environ['WORLD_SIZE']}} local {{os.environ['LOCAL_RANK']}} "
          f"sum {{x.item():g}}", flush=True)
    # (no destroy_process_group: the next run on these procs must still work)

if __name__ == "__main__":
    main()
"""


def _said(procs, marker: str) -> list[str]:
    return logged(procs, marker, count=len(procs))


def test_a_torchrun_script_runs_on_every_proc_and_again_after_an_edit(fresh_procs2, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(factor=1)))
    assert run_spmd(fresh_procs2, [str(script)]).get(timeout=TIMEOUT).values() == [True, True]
    assert _said(fresh_procs2, "sum 3") == ["rank 0/2 local 0 sum 3", "rank 1/2 local 1 sum 3"]
    script.write_text(textwrap.dedent(SCRIPT.format(factor=10)))  # edited: read again, same procs
    run_spmd(fresh_procs2, [str(script)]).get(timeout=TIMEOUT)
    assert _said(fresh_procs2, "sum 30") == ["rank 0/2 local 0 sum 30", "rank 1/2 local 1 sum 30"]


def test_a_script_that_exits_with_an_error_status_fails_its_ranks(fresh_procs2, tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    with pytest.raises(ActorError, match="exited with status 3"):
        run_spmd(fresh_procs2, [str(script)]).get(timeout=TIMEOUT)
    with pytest.raises(MeshSpecError, match="non-empty list of strings"):
        run_spmd(fresh_procs2, str(script))  # type: ignore[arg-type]


def test_a_module_runs_with_its_arguments(state_home, tmp_path):
    (tmp_path / "greet.py").write_text("import sys, os\nprint('greet', os.environ['RANK'], *sys.argv[1:])\n")
    procs = this_host().spawn_procs(per_host={"procs": 2}, env={"PYTHONPATH": str(tmp_path)})
    try:
        run_spmd(procs, ["-m", "greet", "a", "b"]).get(timeout=TIMEOUT)
        assert _said(procs, "greet") == ["greet 0 a b", "greet 1 a b"]
    finally:
        procs.stop()


class Env(Actor):
    @endpoint
    def env(self) -> list[str]:
        return [os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")]


def test_setup_torch_elastic_env_sets_torchruns_variables(fresh_procs2):
    setup_torch_elastic_env(fresh_procs2, "127.0.0.1", 29555)
    seen = fresh_procs2.spawn("env", Env).env.call().get(timeout=TIMEOUT).values()
    assert seen == [["0", "0", "2", "29555"], ["1", "1", "2", "29555"]]
    with pytest.raises(MeshSpecError, match="both master_addr and master_port"):
        setup_torch_elastic_env(fresh_procs2, "127.0.0.1")
