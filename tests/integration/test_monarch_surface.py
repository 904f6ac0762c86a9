"""Members of Monarch's classes that this project gives their meaning (the compat
test only checks they exist): a host mesh's stop, a proc mesh's host mesh and stop
reason, ``Future.as_asyncio``, an ``RDMABuffer``'s backend, owner and timeout, a
job's ``apply_id``, and the options that are refused with what to do instead."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from monarch_kernel import Actor, MeshStoppedError, endpoint, this_host
from monarch_kernel.errors import MeshSpecError
from monarch_kernel.job import LocalJob
from monarch_kernel.rdma import RDMABuffer

TIMEOUT = 60


class Holder(Actor):
    def __init__(self) -> None:
        self.data = np.arange(1000, dtype=np.float64)

    @endpoint
    def buffer(self) -> RDMABuffer:
        return RDMABuffer(self.data)

    @endpoint
    def one(self) -> int:
        return 1


def test_a_host_mesh_stops_what_was_spawned_from_it_and_a_proc_mesh_says_why(state_home):
    hosts = this_host()
    first = hosts.spawn_procs(per_host={"procs": 1})
    second = hosts.spawn_procs(per_host={"procs": 1})
    assert first.host_mesh is hosts and second.host_mesh is hosts
    assert hosts.initialized.get(timeout=TIMEOUT) is True
    hosts.shutdown().get(timeout=TIMEOUT)
    for procs in (first, second):
        with pytest.raises(MeshStoppedError, match="its host mesh was stopped"):
            procs.spawn("h", Holder)
    other = this_host().spawn_procs(per_host={"procs": 1})
    other.stop("training finished").get(timeout=TIMEOUT)
    with pytest.raises(MeshStoppedError, match=r"\(training finished\)"):
        other.spawn("h", Holder)


def test_as_asyncio_and_an_rdma_buffers_members(fresh_procs1):
    holder = fresh_procs1.spawn("holder", Holder)

    async def both() -> list[int]:
        return list(
            await asyncio.gather(holder.one.call_one().as_asyncio(), holder.one.call_one().as_asyncio())
        )

    assert asyncio.run(both()) == [1, 1]
    buf = holder.buffer.call_one().get(timeout=TIMEOUT)
    assert buf.backend == "tcp" and ":" in buf.owner
    assert RDMABuffer(np.zeros(4)).owner == "here"
    dst = np.zeros(1000)
    buf.read_into(dst, timeout=TIMEOUT).get()
    assert dst.sum() == sum(range(1000))
    buf.write_from(np.ones(1000), timeout=TIMEOUT).get()
    buf.drop()


def test_a_jobs_apply_id_and_refused_options_say_what_to_do(state_home):
    job = LocalJob()
    assert job.apply_id is None
    job.apply()
    assert isinstance(job.apply_id, str) and job.apply_id
    with pytest.raises(MeshSpecError, match="this process is the controller"):
        LocalJob().apply(client_script="train.py")
    with pytest.raises(MeshSpecError, match="sched_setaffinity"):
        this_host().spawn_procs(per_host={"procs": 1}, proc_bind=[{"cpunodebind": "0"}])
    with pytest.raises(MeshSpecError, match="with_python_executable"):
        this_host().spawn_procs(per_host={"procs": 1}, bootstrap_command=["python", "-m", "x"])


def _rank_and_pid() -> tuple[int, int]:
    import os

    from monarch_kernel import current_rank

    return current_rank().rank, os.getpid()


def test_a_remote_function_answers_as_an_endpoint_on_the_active_mesh(fresh_procs2):
    from monarch_kernel import MeshTensorError, remote

    who = remote(_rank_and_pid)
    with pytest.raises(MeshTensorError, match="no mesh is active"):
        who.call()
    with fresh_procs2.activate():
        ranks = [rank for rank, _pid in who.call().get(timeout=TIMEOUT).values()]
        one = who.choose().get(timeout=TIMEOUT)
        who.broadcast()
    with fresh_procs2.slice(procs=1).activate():
        assert who.call_one().get(timeout=TIMEOUT)[0] == 0  # (its rank within the slice)
    assert ranks == [0, 1] and one[0] in (0, 1)


class ShardReader(Actor):
    @endpoint
    def first(self, t: Any) -> float:
        return float(t[0])


def test_a_mesh_tensor_passed_to_actors_of_its_mesh_gives_each_its_shard(fresh_procs2, state_home):
    import torch

    from monarch_kernel.errors import SerializationError

    readers = fresh_procs2.spawn("readers", ShardReader)
    with fresh_procs2.activate():
        t = torch.ones(3) * (fresh_procs2.rank_tensor("procs") + 1)
    assert readers.first.call(t).get(timeout=TIMEOUT).values() == [1.0, 2.0]
    other = this_host().spawn_procs(per_host={"procs": 1})
    try:
        with pytest.raises(SerializationError, match="not one of its mesh's procs"):
            other.spawn("readers", ShardReader).first.call(t).get(timeout=TIMEOUT)
    finally:
        other.stop()
