"""``Stream``: Monarch's streams of ops on each proc, and borrows between them.

Ops issued under ``stream.activate()`` run, on procs with CUDA, on a CUDA stream of
that name (``_commands.ON``); a borrow makes the borrowing stream wait for the
lender's work so far, and ``drop()`` makes the lender wait for the borrower's. On the
CPU a proc runs its commands one at a time, in order (TENSOR-1), which is one valid
schedule of any program written with streams and borrows: streams change when work
may overlap, never what it computes. A borrowed tensor is an alias marked with the
borrowing stream.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from monarch_kernel.tensor import _commands as C

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
        lender = t.stream
        t._client.send(t._mesh._shape, (C.BORROW, _name(lender), _name(self)))
        with torch.no_grad(), self.activate():
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
        """Ends the borrow: the lending stream may use the tensor again (it waits, on
        each proc, for the work the borrower issued so far)."""
        if self.dropped:
            return
        self.dropped = True
        t = self.tensor
        t._client.send(t._mesh._shape, (C.DROP, _name(t.stream), _name(self.stream)))

    def __enter__(self) -> Borrow:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.drop()


_default = Stream("main", _default=True)


def _name(stream: Stream) -> str | None:
    """A stream as commands name it: None for the main one."""
    return None if stream.default else stream.name


def default_stream() -> Stream:
    return _default


def get_active_stream() -> Stream:
    """The stream ops go to now (``main`` unless a ``Stream.activate()`` block says otherwise)."""
    return getattr(_local, "stream", None) or _default
