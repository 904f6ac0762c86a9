"""Monarch's ``examples/slurm_ddp.ipynb`` on the test cluster (SLURM in network
namespaces, tools/testcluster), with a tiny model on the CPU (gloo); and its SPMD
form (``docs/source/examples/ddp/spmd_ddp.py``: ``SPMDActor`` running a torchrun-style
script, then ``run_spmd``) on a SLURM mesh. A controller on the login host runs each
``main()`` (``slurm_notebooks``); DDP's result is checked: every rank ends with the
same parameters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cluster_helpers import HERE, wait_no_slurm_jobs

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def test_ddp_actors_on_two_slurm_nodes_take_a_step_and_agree_on_the_parameters(cluster, controllers):
    """slurm_ddp.ipynb: torchrun's environment set on 2 nodes x 2 procs, then the
    ``DDPActor``s' ``setup`` (a gloo group of 4), ``demo_basic`` (one DDP step) and
    ``cleanup``. Every rank started from rank 0's parameters (each seeded its own)
    and ended the step with the same ones, changed."""
    ctl = controllers()
    ctl.run("import asyncio, slurm_notebooks")

    results = ctl.eval("asyncio.run(slurm_notebooks.ddp_main(num_nodes=2, gpus_per_node=2))")

    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert [r["local_rank"] for r in results] == [0, 1, 0, 1]
    assert [r["host"] for r in results] == ["h1", "h1", "h2", "h2"]
    assert {r["world_size"] for r in results} == {4}
    first = results[0]
    for r in results[1:]:
        assert r["started"] == first["started"]
        assert r["stepped"] == pytest.approx(first["stepped"])
    assert first["stepped"] != first["started"]
    assert wait_no_slurm_jobs(cluster) == []


def test_a_torchrun_style_script_trains_on_a_slurm_mesh_and_runs_again_on_the_same_procs(
    cluster, controllers, tmp_path
):
    """spmd_ddp.py on a SLURM mesh of 2 nodes x 2 procs: ``SPMDActor.main`` runs the
    script with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, the master from
    the first proc), then ``run_spmd`` runs it again on the same procs. Each run: 4
    ranks, 5 steps each, the same parameters on every rank at the end."""
    ctl = controllers()
    ctl.run("import slurm_notebooks")
    script = HERE / "spmd_ddp_train.py"
    first, again = tmp_path / "first", tmp_path / "again"

    ctl.run(f"slurm_notebooks.spmd_main({str(script)!r}, {str(first)!r}, {str(again)!r})")

    for out in (first, again):
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
        assert [r["host"] for r in ranks] == ["h1", "h1", "h2", "h2"]
        assert [r["local_rank"] for r in ranks] == [0, 1, 0, 1]
        assert {r["world_size"] for r in ranks} == {4}
        assert {r["steps"] for r in ranks} == {5}
        for r in ranks[1:]:
            assert r["params"] == pytest.approx(ranks[0]["params"])
    assert sorted(p.name for p in Path(first).iterdir()) == [f"rank{r}.json" for r in range(4)]
    assert wait_no_slurm_jobs(cluster) == []
