"""The server extension's tests: pytest-jupyter's in-process Jupyter server
(``jp_serverapp``, ``jp_fetch``, ...) and a named mesh started by a script.

pytest-jupyter's fixtures come in here rather than as a plugin (``pytest_plugins``,
``-p``): its autouse fixtures (a fresh event loop, the server's clean-up) would then
run around every test of the suite, and pytest allows ``pytest_plugins`` only in the
top-level conftest. Its two hooks come too, so that ``async def`` tests run on that
loop; a conftest's hooks apply to the tests of its folder only.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import jupyter_servers
import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403

from monarch_kernel.kernel._install import SERVER_CONFIG


@pytest.fixture
def jp_server_config() -> dict:
    """The server extension enabled as ``monarch-kernel install`` enables it."""
    return copy.deepcopy(SERVER_CONFIG)  # (pytest-jupyter adds its own extensions to it)


@pytest.fixture
def script_mesh(state_home: Path, tmp_path: Path) -> Iterator[str]:
    """A named mesh of 2 procs started by another process (a script), which exits."""
    with jupyter_servers.script_mesh(tmp_path) as name:
        yield name
