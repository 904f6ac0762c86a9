"""``AgentGroup.each`` while the interpreter exits: supervision's daemon threads can
still be at work then, when executors refuse new work; the group does the work one
host after another in that thread rather than raise (it printed a traceback of
"cannot schedule new futures after interpreter shutdown" at the end of a script)."""

from __future__ import annotations

import concurrent.futures.thread as executor_threads
from typing import Any, cast

import pytest

from monarch_kernel.control._group import AgentGroup, HostLink


def _group(n: int) -> AgentGroup:
    return AgentGroup([HostLink(i, cast(Any, None), f"h{i}", 4 * i, 4) for i in range(n)])


def test_each_runs_on_every_host_once_when_executors_take_no_more_work(monkeypatch):
    group = _group(3)
    assert group.each(lambda link: link.index) == [0, 1, 2]
    monkeypatch.setattr(executor_threads, "_shutdown", True)
    seen: list[int] = []

    def one(link: HostLink) -> str:
        seen.append(link.index)
        return link.host

    assert group.each(one) == ["h0", "h1", "h2"]
    assert seen == [0, 1, 2]


def test_each_raises_the_first_error_after_trying_every_host_when_executors_take_no_more_work(monkeypatch):
    monkeypatch.setattr(executor_threads, "_shutdown", True)
    seen: list[int] = []

    def one(link: HostLink) -> int:
        seen.append(link.index)
        if link.index:
            raise ValueError(f"host {link.index} failed")
        return 0

    with pytest.raises(ValueError, match="host 1 failed"):
        _group(3).each(one)
    assert seen == [0, 1, 2]  # GROUP-1: every host was reached


def test_links_of_gives_each_host_of_the_ranks_once_in_host_order():
    group = _group(4)
    assert [link.index for link in group.links_of([13, 1, 2, 12])] == [0, 3]
