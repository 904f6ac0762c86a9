"""The worker side of the tensor engine: ``TensorEngine`` runs the controller's
commands (``monarch_kernel.tensor._commands``) in order against a table of this
proc's real tensors; ``TensorInbox`` takes tensors other procs send it (``to_mesh``).

Both are built-in actors (``__tensor_engine__``, ``__tensor_inbox__``), spawned on a
mesh the first time the controller activates it. The engine's thread runs one batch
at a time (DISPATCH-1), so commands run in the order the controller issued them
(TENSOR-1); the inbox has a thread of its own, so a proc waiting to receive never
blocks the proc that sends to it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import traceback
from typing import Any

from monarch_kernel.actor import Actor, endpoint
from monarch_kernel.errors import MeshTensorError, RemoteException
from monarch_kernel.mesh import Extent, Point, Shape
from monarch_kernel.tensor import _commands as C

#: A collective's dropped CPU result of at least this size is kept for the next
#: collective to reuse, up to SPARE_MAX_BYTES per proc (counted in ``memory()``).
SPARE_MIN_BYTES = 1 << 20
SPARE_MAX_BYTES = 512 << 20
#: How long a proc waits for a tensor another proc sends it before poisoning the
#: result (the sender died, say).
RECV_TIMEOUT_S = 300.0

_arrived: dict[str, Any] = {}
#: This proc's engine (one per proc: its mesh's), for ``held``.
_current: TensorEngine | None = None
_arrival = threading.Condition()


class Failure:
    """Why a ref is poisoned: the first failed command behind it."""

    __slots__ = ("op", "rank", "message", "trace", "exc")

    exc: BaseException | None

    def __init__(self, op: str, rank: int, exc: BaseException) -> None:
        self.op, self.rank = op, rank
        self.message = f"{type(exc).__name__}: {exc}"
        self.trace = "".join(traceback.format_exception(exc))
        self.exc = exc

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "rank": self.rank, "message": self.message, "trace": self.trace}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Failure:
        f = cls.__new__(cls)
        f.op, f.rank, f.message, f.trace, f.exc = d["op"], d["rank"], d["message"], d["trace"], None
        return f


def _me() -> int:
    return int(os.environ.get("MONARCH_RANK", "0"))


def _deposit(transfer_id: str, value: Any) -> None:
    """Hands a tensor sent to this proc (or its sender's failure) to its engine."""
    with _arrival:
        _arrived[transfer_id] = value
        _arrival.notify_all()


class TensorInbox(Actor):
    """Takes the tensors other procs send this one, for its engine to pick up."""

    @endpoint
    def deposit(self, transfer_id: str, value: Any) -> None:
        _deposit(transfer_id, value)


def _take(transfer_id: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    with _arrival:
        while transfer_id not in _arrived:
            left = deadline - time.monotonic()
            if left <= 0 or not _arrival.wait(left):
                if transfer_id in _arrived:
                    break
                raise TimeoutError(f"nothing arrived for transfer {transfer_id} within {timeout:.0f} s")
        return _arrived.pop(transfer_id)


def shard_here(ref: int, mesh: str) -> Any:
    """The value, on this proc, of mesh tensor ``ref`` of mesh ``mesh``: what an actor
    of the tensor's own mesh gets for a mesh tensor among its call's arguments (its
    proc's shard, as in Monarch). The caller had every proc run the commands that make
    it before the call was sent (``Tensor.__reduce_ex__``)."""
    engine = _current
    v = engine.table.get(ref, _MISSING) if engine is not None else _MISSING
    if v is _MISSING:
        raise MeshTensorError(
            f"a mesh tensor of mesh {mesh!r} was passed to an actor on rank {_me()}, which holds no shard "
            "of it (the tensor lives on a slice of the mesh that leaves this rank out): call the actors "
            "of that slice"
        )
    if isinstance(v, Failure):
        raise RemoteException(v.op, v.rank, v.message, v.trace, mesh)
    return v


def held() -> dict[str, int] | None:
    """This proc's tensor memory (see ``TensorEngine.memory``), None without an engine;
    the worker's ``usage`` reports it, for the inspector."""
    engine = _current
    return engine.held() if engine is not None else None


class TensorEngine(Actor):
    """This proc's tensors (ref -> tensor, or the ``Failure`` that poisoned it) and
    the commands that make them."""

    def __init__(self, inbox: Any) -> None:
        self.table: dict[int, Any] = {}
        self.rank = _me()
        self.inbox = inbox
        #: Process groups by key (a set of mesh dims of one mesh): (group, my index, size).
        self.groups: dict[Any, tuple[Any, int, int]] = {}
        #: CUDA streams by name (``Stream``), made on first use.
        self.streams: dict[str, Any] = {}
        #: Dropped large CPU results of collectives, kept for the next collective's new
        #: result (``_keep_spare``), by (bytes, dtype), oldest first.
        self.spare: dict[tuple[int, Any], list[Any]] = {}
        self.spare_bytes = 0
        #: Refs that hold a collective's new result (only those become spares).
        self.collected: set[int] = set()
        global _current
        _current = self

    # -- endpoints ------------------------------------------------------------------

    @endpoint
    def run(self, batch: list[tuple[Any, ...]]) -> None:
        # Spares kept before this batch: used by it, or freed after it. (By id: a spare
        # the batch drops can lend its id to one it keeps, which is then freed early;
        # that costs a reuse, never a wrong value.)
        stale = {id(t) for kept in self.spare.values() for t in kept} if self.spare else None
        for cmd in batch:
            self._one(cmd)
        if stale:
            self._free_spares(stale)

    def _one(self, cmd: tuple[Any, ...]) -> None:
        kind = cmd[0]
        try:
            getattr(self, "_" + kind)(*cmd[1:])
        except Exception as e:  # a bug of the engine itself: poison what it made
            self._poison(_outs_of(cmd), Failure(kind, self.rank, e))

    @endpoint
    def fetch(self, ids: list[int]) -> list[tuple[Any, ...]]:
        """Each ref's value, as ``_wire`` sends it, or why it is poisoned: (False, dict).
        Flat tuples of plain values, so the reply takes the fast pickle path."""
        out: list[tuple[Any, ...]] = []
        for i in ids:
            v = self.table.get(i, _MISSING)
            if v is _MISSING:
                out.append((False, self._missing(i, "fetch").as_dict()))
            elif isinstance(v, Failure):
                out.append((False, v.as_dict()))
            else:
                out.append(_wire(v))
        return out

    @endpoint
    def summary(self, ref: int) -> str | dict[str, Any]:
        """One short line for ``show``: the values (abbreviated), or why it is poisoned (a dict)."""
        v = self.table.get(ref, _MISSING)
        if v is _MISSING:
            return "(deleted)"
        if isinstance(v, Failure):
            return v.as_dict()
        import torch

        with torch.no_grad():
            text = repr(v.detach().cpu()) if v.numel() <= 16 else _brief(v)
        return " ".join(text.split())

    @endpoint
    def memory(self) -> dict[str, int]:
        """Bytes held by this proc's live tensors (storages counted once), and how many refs."""
        return self.held()

    def held(self) -> dict[str, int]:
        seen: set[int] = set()
        total = 0
        for v in list(self.table.values()):
            if isinstance(v, Failure) or not hasattr(v, "untyped_storage"):
                continue
            s = v.untyped_storage()
            key = s.data_ptr()
            if key not in seen:
                seen.add(key)
                total += s.nbytes()
        return {"bytes": total + self.spare_bytes, "refs": len(self.table)}

    # -- commands --------------------------------------------------------------------

    def _missing(self, ref: int, what: str) -> Failure:
        """The failure of a command that names a ref this proc does not hold."""
        return Failure(what, self.rank, KeyError(f"ref {ref} is not on rank {self.rank} (deleted?)"))

    def _poison(self, outs: Any, failure: Failure) -> None:
        for o in [outs] if isinstance(outs, int) else outs:
            if o is not None:
                self.table[o] = failure

    def _load(self, x: Any) -> Any:
        """``x`` with refs replaced by tensors; raises _Poisoned for a poisoned one."""
        t = type(x)
        if t is C.Ref:
            v = self.table.get(x, _MISSING)
            if v is _MISSING:
                raise KeyError(f"ref {int(x)} is not on rank {self.rank} (deleted, or made on another mesh)")
            if isinstance(v, Failure):
                raise _Poisoned(v)
            return v
        if t is tuple or t is list:
            return t(self._load(y) for y in x)
        if t is dict:
            return {k: self._load(v) for k, v in x.items()}
        return x

    def _store(self, outs: Any, result: Any) -> None:
        import torch  # noqa: F401 (first: see TorchDistributed.state)
        import torch.utils._pytree as pytree

        if isinstance(outs, int):  # a remote result kept whole (C.CALL)
            self.table[outs] = result
            return
        leaves = pytree.tree_leaves(result) if len(outs) != 1 or not hasattr(result, "dtype") else [result]
        for o, v in zip(outs, leaves):
            if o is not None:
                self.table[o] = v

    def _run_guarded(self, what: str, outs: Any, fn: Any, args: Any, kwargs: Any) -> None:
        try:
            a, k = self._load(args), self._load(kwargs)
        except _Poisoned as p:
            self._poison(outs, p.failure)
            return
        except Exception as e:
            self._poison(outs, Failure(what, self.rank, e))
            return
        try:
            result = fn(*a, **k)
        except Exception as e:
            self._poison(outs, Failure(what, self.rank, e))
            return
        self._store(outs, result)

    def _op(self, name: str, args: Any, kwargs: Any, outs: list[Any]) -> None:
        try:
            op = C.resolve_op(name)
        except Exception as e:
            self._poison(outs, Failure(name, self.rank, e))
            return
        self._run_guarded(name, outs, op, args, kwargs)

    def _call(self, fn: Any, args: Any, kwargs: Any, outs: Any) -> None:
        name = fn if isinstance(fn, str) else getattr(fn, "__qualname__", repr(fn))
        try:
            f = C.resolve_function(fn)
        except Exception as e:
            self._poison(outs, Failure(f"remote {name}", self.rank, e))
            return
        self._run_guarded(f"remote {name}", outs, f, args, kwargs)

    # -- streams ---------------------------------------------------------------------

    def _cuda_stream(self, name: str | None) -> Any:
        """The CUDA stream named ``name`` (None: the current one), or None without CUDA."""
        import torch

        if not torch.cuda.is_available():
            return None
        if name is None:
            return torch.cuda.current_stream()
        s = self.streams.get(name)
        if s is None:
            s = self.streams[name] = torch.cuda.Stream()
        return s

    def _on(self, stream: str, cmd: tuple[Any, ...]) -> None:
        s = self._cuda_stream(stream)
        if s is None:  # on the CPU a proc runs its commands in order: one valid schedule
            self._one(cmd)
            return
        import torch

        with torch.cuda.stream(s):
            self._one(cmd)

    def _borrow(self, lender: str | None, borrower: str | None) -> None:
        a, b = self._cuda_stream(lender), self._cuda_stream(borrower)
        if a is not None and b is not None:
            b.wait_stream(a)

    def _drop(self, lender: str | None, borrower: str | None) -> None:
        a, b = self._cuda_stream(lender), self._cuda_stream(borrower)
        if a is not None and b is not None:
            a.wait_stream(b)

    def _del(self, ids: list[int]) -> None:
        for i in ids:
            v = self.table.pop(i, None)
            if i in self.collected:
                self.collected.discard(i)
                if v is not None and not isinstance(v, Failure):
                    self._keep_spare(v)
            del v

    # -- spare buffers for collectives ---------------------------------------------------

    def _keep_spare(self, v: Any) -> None:
        """Keeps the large CPU result of a collective that the controller dropped, if
        nothing else holds its memory, for the next collective that needs a new tensor
        of its size (a loop of ``r = t.reduce(...)``): a fresh one costs the kernel's
        zeroing of its pages, a copy's worth. It lives until the end of the next batch
        (``run``), at most ``SPARE_MAX_BYTES``; CUDA tensors are left to torch's
        caching allocator."""
        import torch

        if not isinstance(v, torch.Tensor) or v.device.type != "cpu":
            return  # (CUDA has torch's own caching allocator)
        n = v.numel() * v.element_size()
        if n < SPARE_MIN_BYTES or self.spare_bytes + n > SPARE_MAX_BYTES:
            return
        if not v.is_contiguous() or v.storage_offset() != 0 or v.untyped_storage().nbytes() != n:
            return
        # Nothing else may hold the memory: no view of it (the storage's use count is its
        # tensor's and the temporary handle's) and no other reference to the tensor.
        if torch._C._storage_Use_Count(v.untyped_storage()._cdata) != 2 or sys.getrefcount(v) > 3:
            return
        self.spare.setdefault((n, v.dtype), []).append(v)
        self.spare_bytes += n

    def _free_spares(self, stale: set[int]) -> None:
        """Frees the spares ``stale`` (by id) that are still kept."""
        for key in list(self.spare):
            kept = [t for t in self.spare[key] if id(t) not in stale]
            self.spare_bytes -= key[0] * (len(self.spare[key]) - len(kept))
            if kept:
                self.spare[key] = kept
            else:
                del self.spare[key]

    def _spare_like(self, x: Any) -> Any:
        """A kept tensor of ``x``'s size and dtype (shaped like it), or None."""
        n = x.numel() * x.element_size()
        kept = self.spare.get((n, x.dtype)) if x.device.type == "cpu" else None
        if not kept:
            return None
        self.spare_bytes -= n
        return kept.pop().view(x.shape)

    def _rank(self, out: int, shape: Shape, dims: list[str]) -> None:
        import torch

        point = Point(shape.ranks.index(self.rank), shape.extent)
        value = 0
        for d in dims:
            value = value * point.size(d) + point[d]
        self.table[out] = torch.tensor(value, dtype=torch.long)

    def _group(self, key: Any, groups: list[list[int]]) -> None:
        import torch  # noqa: F401 (first: see TorchDistributed.state)
        import torch.distributed as dist

        for ranks in groups:
            g = dist.new_group(ranks)
            if self.rank in ranks:
                self.groups[key] = (g, ranks.index(self.rank), len(ranks))

    def _reduce(
        self,
        out: int,
        src: int,
        key: Any,
        reduction: str,
        scatter: bool,
        inplace: bool,
        device: str,
    ) -> None:
        import torch
        import torch.distributed

        what = f"reduce({reduction}{', scatter' if scatter else ''})"
        x = self.table.get(src)
        poisoned: Failure | None = x if isinstance(x, Failure) else None
        if x is None:
            poisoned = self._missing(src, what)
        try:
            group, index, n = self.groups[key]
            # Every member learns whether any input is poisoned, so all skip the
            # collective together and none waits for another (TENSOR-1).
            flag = torch.tensor([0 if poisoned is None else 1], dtype=torch.int32, device=device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=group)
            if int(flag.item()):
                self.table[out] = poisoned or Failure(
                    what,
                    self.rank,
                    RuntimeError("the input on another rank of the group failed; inspect that rank for why"),
                )
                return
            result = _collective(x, group, index, n, reduction, scatter, inplace, self._spare_like)
        except Exception as e:
            self.table[out] = poisoned or Failure(what, self.rank, e)
            return
        self.table[out] = result
        if not inplace:
            self.collected.add(out)

    def _send(self, src: int, prefix: str, routes: dict[int, list[int]]) -> None:
        value = self.table.get(src)
        if value is None:
            value = self._missing(src, "to_mesh")
        if isinstance(value, Failure):
            value = value.as_dict()
        for dest in routes.get(self.rank, []):
            tid = f"{prefix}:{self.rank}>{dest}"
            if dest == self.rank:
                _deposit(tid, value)
                continue
            target = self.inbox._new_with_shape(Shape(Extent(["_"], [1]), [dest]))
            target.deposit.call_one(tid, value).get(timeout=RECV_TIMEOUT_S)

    def _recv(self, out: int, prefix: str, sources: dict[int, int]) -> None:
        source = sources[self.rank]
        try:
            value = _take(f"{prefix}:{source}>{self.rank}", RECV_TIMEOUT_S)
        except TimeoutError as e:
            self.table[out] = Failure(f"to_mesh from rank {source}", self.rank, e)
            return
        if isinstance(value, dict):  # the sender's value was poisoned
            self.table[out] = Failure.from_dict(value)
        else:
            self.table[out] = value

    def _unpack(self, tree: int, outs: list[Any]) -> None:
        v = self.table.pop(tree, None)
        if isinstance(v, Failure) or v is None:
            self._poison(outs, v or self._missing(tree, "remote"))
            return
        self._store(outs, v)

    @endpoint
    def describe(self, tree: int) -> Any:
        """The structure of a ``remote`` result stored whole under ``tree``: tensors
        replaced by (shape, stride, dtype, device); or its failure (a dict)."""
        import torch
        import torch.utils._pytree as pytree

        v = self.table.get(tree)
        if isinstance(v, Failure):
            return v.as_dict()
        leaves, spec = pytree.tree_flatten(v)
        metas = [
            ("t", tuple(x.shape), tuple(x.stride()), x.dtype, str(x.device))
            if isinstance(x, torch.Tensor)
            else ("v", x)
            for x in leaves
        ]
        return metas, spec


class _Poisoned(Exception):
    def __init__(self, failure: Failure) -> None:
        self.failure = failure


_MISSING = object()


def _outs_of(cmd: tuple[Any, ...]) -> list[Any]:
    kind = cmd[0]
    if kind in (C.OP, C.CALL):
        return [cmd[4]] if isinstance(cmd[4], int) else list(cmd[4])
    if kind in (C.RANK, C.REDUCE, C.RECV):
        return [cmd[1]]
    if kind == C.UNPACK:
        return list(cmd[2])
    if kind == C.ON:
        return _outs_of(cmd[2])
    return []


def _alone(v: Any) -> Any:
    """``v`` on the CPU, owning just its own memory: a view of a large tensor would
    otherwise send all of its base."""
    import torch

    if not isinstance(v, torch.Tensor):
        return v
    v = v.detach().cpu()
    if v.untyped_storage().nbytes() != v.numel() * v.element_size() or not v.is_contiguous():
        v = v.clone(memory_format=torch.contiguous_format)
    return v


#: A fetched tensor smaller than this travels as plain bytes in the reply (the fast
#: pickle path); larger ones as tensors, out of band through the transfer engine.
INLINE_BYTES = 16 * 1024


def _wire(v: Any) -> tuple[Any, ...]:
    """How a fetched value travels: (True, "raw", bytes, dtype, shape) for a small CPU
    tensor, else (True, "value", v) (a large tensor goes out of band, owning just its
    own memory); rebuilt by ``monarch_kernel.tensor._ops._unwire``."""
    import torch

    if not isinstance(v, torch.Tensor):
        return (True, "value", v)
    n = v.numel() * v.element_size()
    if n < INLINE_BYTES and v.device.type == "cpu" and v.layout == torch.strided:
        if not v.is_contiguous():
            v = v.contiguous()
        # The bytes straight from memory: a few torch calls cost tens of microseconds
        # on a worker's thread, which is most of a small fetch.
        data = ctypes.string_at(v.data_ptr(), n) if n else b""
        return (True, "raw", data, str(v.dtype).removeprefix("torch."), tuple(v.shape))
    return (True, "value", _alone(v))


def _brief(v: Any) -> str:
    flat = v.detach().reshape(-1)
    head = ", ".join(f"{x:.4g}" if v.is_floating_point() else str(int(x)) for x in flat[:4].tolist())
    return f"tensor([{head}, ...]) shape={list(v.shape)} dtype={str(v.dtype).replace('torch.', '')}"


_OPS = {
    "sum": "SUM",
    "avg": "SUM",
    "product": "PRODUCT",
    "min": "MIN",
    "max": "MAX",
    "band": "BAND",
    "bor": "BOR",
    "bxor": "BXOR",
}


def _collective(
    x: Any,
    group: Any,
    index: int,
    n: int,
    reduction: str,
    scatter: bool,
    inplace: bool,
    spare: Any = lambda x: None,
) -> Any:
    """Monarch's reduce semantics over ``group`` (this proc is ``index`` of ``n``):
    all-reduce, reduce-scatter (``scatter``), all-gather (``stack``), all-to-all
    (``stack`` and ``scatter``). ``inplace``: the result goes into ``x`` (an
    all-reduce of a contiguous ``x`` runs on it directly, with no copy)."""
    import torch
    import torch.distributed as dist

    if reduction == "stack":
        src = x.contiguous()
        parts = [torch.empty_like(src) for _ in range(n)]
        dist.all_gather(parts, src, group=group)
        stacked = torch.stack(parts)
        result = stacked[:, index].contiguous() if scatter else stacked
    else:
        direct = inplace and not scatter and x.is_contiguous()
        if direct:
            y = x
        else:
            kept = spare(x)
            y = kept.copy_(x) if kept is not None else x.contiguous().clone()
        dist.all_reduce(y, op=getattr(dist.ReduceOp, _OPS[reduction]), group=group)
        if reduction == "avg":  # (integers: floor division, keeping the dtype)
            y.div_(n) if y.is_floating_point() else y.div_(n, rounding_mode="floor")
        if direct:
            return x
        result = y[index].contiguous() if scatter else y
    if inplace:
        x.copy_(result)
        return x
    return result
