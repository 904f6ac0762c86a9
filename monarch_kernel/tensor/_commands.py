"""The tensor engine's command format: what the controller sends and every worker
runs (its one home, imported by both sides).

A batch is a list of commands, each a tuple whose first item is its kind. Tensors
in a command are ``Ref``s (an id in the worker's table); everything else is a plain
value, pickled with the batch (a local tensor used as a constant travels out of band,
as any tensor argument does).

TENSOR-1: a worker runs the commands it is sent in the order they were issued. A
command that fails, or whose input is poisoned, poisons its results (the first
failure, with the op, the rank and the remote traceback, is what every later use
reports). A collective whose input is poisoned on any member is skipped by all of
them together, and poisons every member's result, so no rank waits for another.
"""

from __future__ import annotations

from typing import Any

#: ``("op", name, args, kwargs, outs)``: run aten op ``name``; ``outs`` is one ref id
#: per tensor of the flattened result, in order (None where no tensor is kept).
OP = "op"
#: ``("call", fn, args, kwargs, outs)``: run ``fn`` (a function, or "module.fn") as
#: ``remote``; ``outs`` as for ops, or one id (an int) to keep the result whole there.
CALL = "call"
#: ``("del", [ids])``: drop these refs.
DEL = "del"
#: ``("rank", out, shape, dims)``: a 0-d long tensor, this proc's index along ``dims``
#: of the mesh ``shape`` (a ``Shape``).
RANK = "rank"
#: ``("group", key, groups)``: make the process groups ``groups`` (lists of
#: torch.distributed ranks) for a set of mesh dimensions, under ``key``.
GROUP = "group"
#: ``("reduce", out, src, key, reduction, scatter, inplace, device)``:
#: Monarch's reduce of ``src`` over the groups under ``key``.
REDUCE = "reduce"
#: ``("send", src, prefix, routes)`` (proc rank -> the ranks it sends to) and
#: ``("recv", out, prefix, sources)`` (proc rank -> the rank it receives from): move
#: a tensor between procs (``to_mesh``), out of band, through the receiver's inbox.
SEND = "send"
RECV = "recv"
#: ``("unpack", tree, outs)``: split a ``remote`` result kept whole under ``tree``
#: (its structure was not known when it was sent) into refs ``outs``.
UNPACK = "unpack"

#: ``("on", stream, cmd)``: run ``cmd`` on the named stream (a CUDA stream of its own
#: where the proc has CUDA; the commands' order either way).
ON = "on"
#: ``("borrow", lender, borrower)`` and ``("drop", lender, borrower)``: the borrowing
#: stream waits for the lender's work so far; at the drop, the lender waits for the
#: borrower's (streams by name, None for the main one).
BORROW = "borrow"
DROP = "drop"

#: Monarch's reductions (``Tensor.reduce``).
REDUCTIONS = ("stack", "sum", "avg", "product", "min", "max", "band", "bor", "bxor")


class Ref(int):
    """A tensor in a worker's table, by id."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Ref({int(self)})"

    def __reduce__(self) -> Any:
        return (Ref, (int(self),))


def op_name(func: Any) -> str:
    """``aten::add.Tensor`` for ``torch.ops.aten.add.Tensor`` (what a command names)."""
    return str(func._schema.name) + ("." + func._overloadname if func._overloadname != "default" else "")


_ops: dict[str, Any] = {}


def resolve_op(name: str) -> Any:
    """The op a command names (cached: a worker resolves each name once)."""
    op = _ops.get(name)
    if op is None:
        import torch

        ns, _, rest = name.partition("::")
        base, _, overload = rest.partition(".")
        op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
        _ops[name] = op
    return op


def resolve_function(fn: Any) -> Any:
    """A ``remote`` function: itself, or the function a "module.fn" string names."""
    if not isinstance(fn, str):
        return fn
    import importlib

    module, _, attr = fn.rpartition(".")
    if not module:
        raise ValueError(f"remote({fn!r}): name a function as 'module.function'")
    return getattr(importlib.import_module(module), attr)
