"""Monarch's ``monarch.config`` and ``monarch.actor.config``: runtime settings.

Monarch's settings configure its Rust runtime (hyperactor: transports, encodings,
timeouts). This project's runtime takes its settings from ``MONARCH_*`` environment
variables (docs/environment.md), so these functions keep what they are given and give
it back (code that sets and reads settings runs), and ``prefix_python_logs_with_actor``
is kept as Monarch code sets it; none of them changes how this runtime behaves
(docs/monarch-compat.md)."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from typing import Any

#: ``monarch.actor.config.prefix_python_logs_with_actor``, kept as set.
prefix_python_logs_with_actor = False

_runtime: dict[str, Any] = {}


class Encoding(enum.Enum):
    """Monarch's message encodings (messages here are pickled, always)."""

    Bincode = "bincode"
    Json = "json"
    Multipart = "multipart"


def configure(**kwargs: Any) -> None:
    """Keeps ``kwargs`` as this process's runtime settings (``get_runtime_config``)."""
    _runtime.update(kwargs)


def get_runtime_config() -> dict[str, Any]:
    """The settings ``configure`` was given (a copy)."""
    return dict(_runtime)


def get_global_config() -> dict[str, Any]:
    """The settings in force: those ``configure`` was given."""
    return dict(_runtime)


def clear_runtime_config() -> None:
    """Forgets every setting ``configure`` was given."""
    _runtime.clear()


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[dict[str, Any]]:
    """``with configured(key=value):`` the settings with ``overrides``, restored after."""
    before = dict(_runtime)
    _runtime.update(overrides)
    try:
        yield dict(_runtime)
    finally:
        _runtime.clear()
        _runtime.update(before)


def parametrize_config(**config_options: Any) -> Any:
    """Monarch's pytest helper for its own runtime's settings. Not here: raises."""
    raise NotImplementedError(
        "monarch_kernel has no parametrize_config: its runtime's settings are MONARCH_* environment "
        "variables (docs/environment.md); parametrize a test with pytest's monkeypatch.setenv"
    )


def parametrize_config_pointwise(**config_options: Any) -> Any:
    """Monarch's pytest helper for its own runtime's settings. Not here: raises."""
    raise NotImplementedError(
        "monarch_kernel has no parametrize_config_pointwise: its runtime's settings are MONARCH_* "
        "environment variables (docs/environment.md); parametrize a test with pytest's monkeypatch.setenv"
    )


__all__ = [
    "Encoding",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
]
