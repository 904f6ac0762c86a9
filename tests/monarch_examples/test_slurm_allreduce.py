"""Monarch's ``examples/slurm_allreduce.ipynb`` on the test cluster (SLURM in network
namespaces, tools/testcluster): a controller on the login host runs the notebook's
``main()`` (``slurm_notebooks.allreduce_main``): a ``SlurmJob`` of two nodes, procs
on each, the master's address from rank 0, and an all-reduce of one-hot ranks that
gives every rank the world size; then ``kill()`` releases the nodes."""

from __future__ import annotations

import pytest
from cluster_helpers import wait_no_slurm_jobs

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def test_an_allreduce_of_one_hot_ranks_gives_every_rank_the_world_size(cluster, controllers):
    """The notebook with 2 nodes x 2 "gpus" (CPU procs, gloo): rank 0 is on h1, the
    master's address; each of the 4 ranks computes 4; the job is gone after ``kill()``."""
    ctl = controllers()
    ctl.run("import asyncio, slurm_notebooks")

    out = ctl.eval("asyncio.run(slurm_notebooks.allreduce_main(num_nodes=2, gpus_per_node=2))")

    assert out["sizes"] == {"hosts": 2, "gpus": 2}
    assert out["master_addr"] == "h1"
    assert out["world_sizes"] == {"rank_0": 4, "rank_1": 4, "rank_2": 4, "rank_3": 4}
    assert wait_no_slurm_jobs(cluster) == []
