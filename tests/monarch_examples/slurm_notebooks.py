"""The ``main()`` of Monarch's SLURM notebooks (``examples/slurm_allreduce.ipynb``,
``examples/slurm_ddp.ipynb``) and of its SPMD DDP example
(``docs/source/examples/ddp/spmd_ddp.py``, on a SLURM mesh here), written for this
project, for a controller on the test cluster's login host to run. Each returns what
the notebook logs or prints, for the test to check (and logs where the notebook
prints: the controller's stdout is the test's line to it).

``SlurmJob`` takes the notebooks' arguments (``meshes``, ``job_name``,
``time_limit``) but ``gpus_per_node``: the test cluster's nodes have no GPUs, so
SLURM is asked for none, and ``spawn_procs({"gpus": N})`` runs N procs per node on
the CPU. Monarch's ``monarch_port`` (which the notebooks do not pass) is refused here.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import cloudpickle
from slurm_example_actors import ComputeWorldSizeActor, DDPActor, _HostnameActor

from monarch_kernel.job import SlurmJob
from monarch_kernel.spmd import SPMDActor, run_spmd, setup_torch_elastic_env_async

logger: logging.Logger = logging.getLogger(__name__)


async def allreduce_main(num_nodes: int = 2, gpus_per_node: int = 2) -> dict[str, Any]:
    """slurm_allreduce.ipynb's ``main()``: the master's address from rank 0, then every
    rank all-reduces a one-hot tensor of its rank, which sums to the world size."""
    cloudpickle.register_pickle_by_value(sys.modules[ComputeWorldSizeActor.__module__])
    mesh_name = "mesh0"
    master_port = 29500

    # Create SLURM job
    slurm_job = SlurmJob(
        meshes={mesh_name: num_nodes},
        job_name="monarch_example",
        time_limit="06:00:00",
    )

    try:
        # Get job state and create process mesh
        job_state = slurm_job.state()
        proc_mesh = job_state.mesh0.spawn_procs({"gpus": gpus_per_node})

        # Get master_addr from rank 0
        hostname_actor = proc_mesh.spawn("hostname_actor", _HostnameActor)
        hostname_values = await hostname_actor.flatten("rank").slice(rank=0).get_hostname.call()
        master_addr = hostname_values.item()

        # Spawn actor
        actor = proc_mesh.spawn("compute_world_size_actor", ComputeWorldSizeActor)

        logger.info("computing world size...")
        # this is redundant but is here for example sake
        values = await actor.compute_world_size.call(
            master_addr=master_addr,
            master_port=master_port,
        )

        values_by_rank = {f"rank_{p.rank}": v for p, v in list(values.flatten("rank"))}
        logger.info(f"computed world_sizes:\n{json.dumps(values_by_rank, indent=2)}")
        return {"sizes": proc_mesh.sizes, "master_addr": master_addr, "world_sizes": values_by_rank}
    finally:
        # Cancel the SLURM job, releasing all reserved nodes back to the cluster
        slurm_job.kill()
        logger.info("Job terminated successfully")


async def ddp_main(num_nodes: int = 2, gpus_per_node: int = 2) -> list[dict[str, Any]]:
    """slurm_ddp.ipynb's ``main()``: torchrun's environment on every proc (the
    notebook's ``setup_env_for_distributed``, which it never defines: its import is
    ``setup_torch_elastic_env_async``), then ``setup``, ``demo_basic`` and ``cleanup``
    of the ``DDPActor``s; what each ``demo_basic`` returned."""
    mesh_name = "mesh0"

    # Create SLURM job
    slurm_job = SlurmJob(
        meshes={mesh_name: num_nodes},
        job_name="monarch_example",
        time_limit="06:00:00",
    )

    try:
        # Get job state and create process mesh
        job_state = slurm_job.state()
        proc_mesh = job_state.mesh0.spawn_procs({"gpus": gpus_per_node})

        # Spawn DDP actor
        ddp_actor = proc_mesh.spawn("ddp_actor", DDPActor)

        # Setup distributed environment
        await setup_torch_elastic_env_async(proc_mesh)

        # Run DDP example
        await ddp_actor.setup.call()
        results = await ddp_actor.demo_basic.call()
        await ddp_actor.cleanup.call()

        logger.info("DDP example completed successfully!")
        return list(results.values())
    finally:
        # Cancel the SLURM job, releasing all reserved nodes back to the cluster
        slurm_job.kill()
        logger.info("Job terminated successfully")


def spmd_main(
    train_script: str, out_first: str, out_again: str, num_nodes: int = 2, gpus_per_host: int = 2
) -> None:
    """spmd_ddp.py on the SLURM mesh: ``SPMDActor``s, the first one's host and a free
    port as the master, and ``main`` runs the torchrun-style script on every proc
    (writing to ``out_first``); then this project's ``run_spmd`` runs it again on the
    same procs (writing to ``out_again``)."""
    slurm_job = SlurmJob(meshes={"mesh0": num_nodes}, job_name="monarch_example", time_limit="06:00:00")
    try:
        local_proc_mesh = slurm_job.state().mesh0.spawn_procs(per_host={"gpus": gpus_per_host})

        spmd_actors = local_proc_mesh.spawn("_SPMDActor", SPMDActor)
        # Get master address/port from first actor (all coordinates = 0)
        first_values = dict.fromkeys(local_proc_mesh.extent.labels, 0)
        master_addr, master_port = spmd_actors.slice(**first_values).get_host_port.call_one(None).get()
        # Execute training script across the mesh
        spmd_actors.main.call(master_addr, master_port, [train_script, "--out", out_first]).get()

        run_spmd(local_proc_mesh, [train_script, "--out", out_again]).get()
        logger.info("DDP example completed successfully!")
    finally:
        slurm_job.kill()
