"""The notebook tests run whole notebooks through the kernel: every test in this folder
is marked ``slow`` (``make test-fast`` leaves them out)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.slow)
