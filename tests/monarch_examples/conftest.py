"""Fixtures of the tests that follow Monarch's examples (``docs/source/examples/*.py``
and ``examples/slurm_*.ipynb`` of meta-pytorch/monarch), each step taken here with
this project's API and its result checked.

- every unnamed mesh a test spawns is stopped at its end, also when it fails
  (``shutdown_context()``, Monarch's own way to stop what a script started), so the
  tests can spawn meshes as the examples do;
- ``printed``: ``with printed:`` keeps what this process prints (the workers' lines
  it shows included), for a test to wait for;
- ``cluster`` and ``controllers``: the test cluster (SLURM in network namespaces,
  tools/testcluster) and controllers on its login host, for the SLURM notebooks.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import HERE
from proc_helpers import wait_for

from monarch_kernel import shutdown_context
from tests.multihost.cluster_checks import down_all
from tests.multihost.controller import Controller
from tools.testcluster import Cluster, unavailable


@pytest.fixture(autouse=True)
def stop_meshes(state_home: Path) -> Iterator[None]:
    """Stops every unnamed mesh this process spawned during the test."""
    try:
        yield
    finally:
        shutdown_context()


class Printed:
    """What this process prints to ``sys.stdout`` (the workers' lines that a script
    shows, ``[MESH RANK] line``, included) while ``with printed:`` lasts, kept and
    still printed. Those lines reach the client after the call that printed them:
    ``wait_for`` waits for what a test expects.

    (Not ``capfd``: reading it empties it, and a line written meanwhile by the thread
    that shows the workers' lines would be lost. Entered in the test itself, since
    pytest sets ``sys.stdout`` again when the test's call begins.)
    """

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._lock = threading.Lock()
        self._outer: Any = None

    def __enter__(self) -> Printed:
        self._outer, sys.stdout = sys.stdout, self
        return self

    def __exit__(self, *exc: object) -> None:
        if sys.stdout is self:
            sys.stdout = self._outer

    def write(self, text: str) -> int:
        with self._lock:
            self._parts.append(text)
        return self._outer.write(text)

    def flush(self) -> None:
        self._outer.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty...: the stream's
        return getattr(self._outer, name)

    @property
    def text(self) -> str:
        with self._lock:
            return "".join(self._parts)

    def wait_for(self, predicate: Callable[[str], bool], within: float = 60.0) -> str:
        """The text once ``predicate(text)`` holds (or after ``within`` s)."""
        wait_for(lambda: predicate(self.text), within, every=0.2)
        return self.text


@pytest.fixture
def printed() -> Iterator[Printed]:
    """A ``Printed``, for ``with printed:`` in the test."""
    p = Printed()
    try:
        yield p
    finally:
        p.__exit__()


# -- the test cluster -------------------------------------------------------------------


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """Hosts h1 and h2 with sshd and SLURM, and the login host, for the session; the
    test is skipped, saying why, where this machine cannot make one."""
    if reason := unavailable():
        pytest.skip(f"no test cluster: {reason}")
    Cluster.reap_stale()
    with Cluster.up(hosts=2) as made:
        yield made


@pytest.fixture
def controllers(cluster: Cluster, state_home: Path, tmp_path: Path) -> Iterator[Callable[[], Controller]]:
    """``new()``: a controller on the login host, in a folder of the test's own (where
    ``SlurmJob.state()`` saves the job, as Monarch's does, in ``.monarch/``), that
    imports this folder's modules. At the end every mesh is stopped and no process
    of ours may be left on any host."""
    made: list[Controller] = []

    def new() -> Controller:
        c = Controller(cluster, str(state_home))
        made.append(c)
        c.run(f"import os, sys\nos.chdir({str(tmp_path)!r})\nsys.path.insert(0, {str(HERE)!r})")
        return c

    try:
        yield new
    finally:
        for c in made:
            c.close()
        down_all(cluster, state_home)
