"""``Stream``: Monarch's streams of ops on each proc, and borrows between them.

On the CPU a proc runs its commands one at a time, in order (TENSOR-1), which is one
valid schedule of any program written with streams and borrows: streams change when
work may overlap on a GPU, never what it computes. A borrow here is an alias of the
tensor marked with the borrowing stream; ``drop()`` ends it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_local = threading.local()


class Stream:
    """A named stream of work on each proc (Monarch's ``monarch.Stream``)."""

    def __init__(self, name: str, _default: bool = False) -> None:
        self.name = name
        self.default = _default

    def __repr__(self) -> str:
        return f"<Stream({self.name!r})>"

    @contextlib.contextmanager
    def activate(self) -> Iterator[Stream]:
        """Ops issued in the block are on this stream."""
        prev = getattr(_local, "stream", None)
        _local.stream = self
        try:
            yield self
        finally:
            _local.stream = prev

    def borrow(self, t: Any, mutable: bool = False) -> tuple[Any, Borrow]:
        """``t`` for use on this stream, and the ``Borrow`` whose ``drop()`` gives it back."""
        import torch

        if not hasattr(t, "_client"):  # (a mesh tensor: monarch_kernel.tensor._tensor.Tensor)
            raise TypeError(f"Stream.borrow takes a mesh tensor, not {type(t).__name__}")
        with torch.no_grad():
            alias = torch.ops.aten.alias.default(t)
        alias._stream = self
        b = Borrow(t, alias, self, mutable)
        return alias, b


class Borrow:
    """A tensor lent to another stream until ``drop()``."""

    def __init__(self, tensor: Any, alias: Any, stream: Stream, mutable: bool) -> None:
        self.tensor, self.alias, self.stream, self.mutable = tensor, alias, stream, mutable
        self.dropped = False

    def drop(self) -> None:
        """Ends the borrow: the lending stream may use the tensor again."""
        self.dropped = True

    def __enter__(self) -> Borrow:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.drop()


_default = Stream("main", _default=True)


def default_stream() -> Stream:
    return _default


def get_active_stream() -> Stream:
    """The stream ops go to now (``main`` unless a ``Stream.activate()`` block says otherwise)."""
    return getattr(_local, "stream", None) or _default
