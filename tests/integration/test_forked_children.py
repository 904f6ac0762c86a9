"""A worker whose forked child outlives it (a data loader, a compile worker): the
child holds every socket the worker had, its listening one too, so the worker's
address still takes connections after it died. Its calls still fail at once with its
death (the agent and supervision abandon them), never wait on the child."""

from __future__ import annotations

import os
import signal
import time

import pytest

from monarch_kernel import Actor, SupervisionError, endpoint

TIMEOUT = 60


class Forker(Actor):
    @endpoint
    def fork_sleeper(self) -> int:
        child = os.fork()
        if child == 0:  # keeps every descriptor it inherited; does nothing else
            time.sleep(300)
            os._exit(0)
        return child

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def nap(self, seconds: float) -> str:
        time.sleep(seconds)
        return "woke"


def test_calls_to_a_killed_worker_whose_child_holds_its_socket_fail_with_its_death(fresh_procs2):
    a = fresh_procs2.spawn("forker", Forker)
    child = a.slice(procs=1).fork_sleeper.call_one().get(timeout=TIMEOUT)
    try:
        pid = a.slice(procs=1).pid.call_one().get(timeout=TIMEOUT)
        call = a.slice(procs=1).nap.call_one(30.0)
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(SupervisionError, match="SIGKILL"):
            call.get(timeout=TIMEOUT)
    finally:
        os.kill(child, signal.SIGKILL)
