"""A call to many ranks fails as soon as one of their workers dies, whatever the
others do (before, it waited until every survivor had replied, forever if they
waited on the dead rank)."""

from __future__ import annotations

import os
import time

import pytest
from proc_helpers import wait_for

from monarch_kernel import Actor, SupervisionError, endpoint


class Napper(Actor):
    @endpoint
    def nap_or_die(self, seconds: float) -> str:
        if os.environ["MONARCH_RANK"] == "1":
            os._exit(3)
        time.sleep(seconds)  # a survivor busy far longer than the test waits
        return "woke"

    @endpoint
    def ping(self) -> int:
        return int(os.environ["MONARCH_RANK"])


def test_a_mesh_wide_call_fails_at_the_first_dead_rank_while_the_others_still_run(fresh_procs2):
    nappers = fresh_procs2.spawn("napper", Napper)
    future = nappers.nap_or_die.call(120.0)
    with pytest.raises(SupervisionError) as info:
        future.get(timeout=20)  # rank 0 naps for 120 s: only a fast failure ends this
    assert info.value.rank == 1
    assert "code 3" in str(info.value)
    with pytest.raises(SupervisionError):  # the Future keeps its result
        future.get(timeout=1)
    assert wait_for(lambda: fresh_procs2.status() == ["alive", "dead"])  # the agent's report follows


def test_a_spawn_fails_at_the_first_dead_rank_too(fresh_procs2):
    class Doomed(Actor):
        def __init__(self) -> None:
            if os.environ["MONARCH_RANK"] == "0":
                os._exit(4)
            time.sleep(120)  # rank 1's constructor outlasts the test

    with pytest.raises(SupervisionError) as info:
        fresh_procs2.spawn("doomed", Doomed)
    assert info.value.rank == 0
