"""Meshes the integration tests share the making of: a few procs, stopped after the
test; and named meshes that a test may fence or break, stopped as an administrator."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from monarch_kernel import this_host
from monarch_kernel.controller import stop_record
from monarch_kernel.hosts import _registry


def _procs(n: int) -> Iterator[Any]:
    procs = this_host().spawn_procs(per_host={"procs": n})
    yield procs
    procs.stop()


@pytest.fixture
def fresh_procs1(state_home):
    """One proc of the test's own (a test may break it), stopped after the test."""
    yield from _procs(1)


@pytest.fixture
def fresh_procs2(state_home):
    """Two procs of the test's own (a test may break them), stopped after the test."""
    yield from _procs(2)


@pytest.fixture
def named_mesh(state_home) -> Iterator[Callable[[int], tuple[str, Any]]]:
    """``named_mesh(n)``: a new named mesh of ``n`` procs, as (name, procs). Each is
    stopped at the end through its state file, as an administrator: whether this
    process still controls it or not (fenced, detached, stopped by the test)."""
    names: list[str] = []

    def make(n: int, prefix: str = "t") -> tuple[str, Any]:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        names.append(name)
        return name, this_host().spawn_procs(per_host={"procs": n}, name=name)

    yield make
    for name in names:
        rec = _registry.read(name)
        if rec is not None:
            stop_record(rec)
