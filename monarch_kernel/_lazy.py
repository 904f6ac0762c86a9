"""Lazy package attributes (PEP 562), so a process imports only what it uses: the
host agent needs only ``_native``, a worker only what it runs."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``names`` (attribute -> ``module``,
    ``module:attribute`` for an alias, or ``module:*`` for the module itself: a
    namespace the package exports), imported on first use and then cached in the
    package's namespace."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = module.partition(":")
        loaded = importlib.import_module(module)
        value = loaded if attr == "*" else getattr(loaded, attr or name)
        setattr(importlib.import_module(package), name, value)
        return value

    return __getattr__
