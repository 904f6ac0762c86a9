"""The built-in actor every worker has (``worker._builtin.WorkerBuiltin``), called as
every actor is (``mesh._builtin.call_builtin``: arguments pickled as ``(args,
kwargs)``), here on this process's own worker server and dispatcher
(``this_proc()``, in-process): its endpoints answer on the routing thread, while an
actor is busy; a name that is none of its endpoints is refused."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import pytest

from monarch_kernel import Actor, ActorError, endpoint, this_proc
from monarch_kernel._wire import BUILTIN
from monarch_kernel.mesh._actor_mesh import decode_reply
from monarch_kernel.mesh._builtin import call_builtin
from monarch_kernel.worker._builtin import ENDPOINTS

TIMEOUT = 30


def _ask(method: str, *args: Any) -> Any:
    ref = this_proc()._proc
    (call,) = call_builtin(ref.conns([0]), [0], method, *args)
    return decode_reply(call.wait(TIMEOUT), ref, 0, ref.point(0), f"{BUILTIN}.{method}")


#: Events of the Blocker below: it runs in this process (``this_proc()``), so it
#: shares this module with the test.
_STARTED = threading.Event()
_RELEASE = threading.Event()


class Blocker(Actor):
    """A sync actor whose endpoint holds its thread until the test releases it."""

    @endpoint
    def hold_the_actor_thread(self) -> str:
        _STARTED.set()
        _RELEASE.wait(TIMEOUT)
        return "released"


def test_the_builtin_actor_has_the_endpoints_the_docs_list():
    assert ENDPOINTS == {
        "busy",
        "calls_in_flight",
        "comm_msg",
        "debug_waiting",
        "flush",
        "log_level",
        "pdb_input",
        "post_mortem",
        "root",
        "stacks",
        "supervise",
        "usage",
        "workspace_apply",
        "workspace_plan",
        "workspace_use",
    }


def test_stacks_and_busy_answer_while_an_actor_of_the_process_is_busy():
    blocker = this_proc().spawn("builtin_blocker", Blocker)
    held = blocker.hold_the_actor_thread.call_one()
    try:
        assert _STARTED.wait(TIMEOUT)
        assert "hold_the_actor_thread" in _ask("stacks")
        running = _ask("busy")
        assert any(what.endswith(".hold_the_actor_thread") for _call, what, _where in running), running
    finally:
        _RELEASE.set()
        assert held.get(timeout=TIMEOUT) == "released"
        blocker.stop().get(timeout=TIMEOUT)


def test_log_level_sets_the_root_loggers_level():
    root = logging.getLogger()
    before = root.level
    try:
        assert _ask("log_level", 17) is None
        assert root.level == 17
    finally:
        root.setLevel(before)


def test_root_sets_monarch_root():
    before = os.environ.get("MONARCH_ROOT")
    try:
        assert _ask("root", '["127.0.0.1:1", "t"]') is None
        assert os.environ["MONARCH_ROOT"] == '["127.0.0.1:1", "t"]'
    finally:
        if before is None:
            os.environ.pop("MONARCH_ROOT", None)
        else:
            os.environ["MONARCH_ROOT"] = before


def test_pdb_input_with_no_debugger_waiting_says_so():
    assert _ask("pdb_input", "c") is False


def test_usage_measures_this_process():
    got = _ask("usage")
    assert got["rss"] > 0 and "cpu" in got


@pytest.mark.parametrize("method", ["no_such_method", "logger", "__init__", "_d"])
def test_a_name_that_is_no_endpoint_of_the_builtin_actor_is_refused(method):
    with pytest.raises(Exception, match=f"the built-in actor has no method '{method}'"):
        _ask(method)


def test_wrong_arguments_come_back_as_an_actor_error_and_the_builtin_actor_goes_on():
    with pytest.raises(ActorError, match="log_level"):
        _ask("log_level")
    assert _ask("pdb_input", "c") is False
