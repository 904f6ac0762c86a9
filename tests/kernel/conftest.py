"""Fixtures of the kernel tests: one kernel, and one mesh on it, per test module."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kernel_harness import Kernel, start, stop


@pytest.fixture(scope="module")
def kernel(jupyter_path: None) -> Iterator[Kernel]:
    k = start()
    k.run("1")  # the start line
    yield k
    k.run("%mesh down --all")
    stop(k)


@pytest.fixture(scope="module")
def mesh(kernel: Kernel) -> str:
    name = f"k-{uuid.uuid4().hex[:6]}"
    out = kernel.run(f"procs = %mesh up {name} --procs 2")
    assert out.error is None, out.traceback
    assert f"mesh '{name}' up: 2 procs" in out.stdout
    return name
