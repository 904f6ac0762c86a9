"""What the tensor engine offers beyond torch's own ops, with Monarch's names:
collectives over mesh dimensions (``reduce``), moving tensors between meshes
(``to_mesh``), rank tensors, ``remote`` functions, and the sync points that bring
values to the controller (``fetch_shard``, ``inspect``, ``show``)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from monarch_kernel._ranks import ranks_span
from monarch_kernel.errors import MeshTensorError, RemoteException
from monarch_kernel.mesh import Future, ProcMesh
from monarch_kernel.tensor import _commands as C
from monarch_kernel.tensor._activate import active_mesh, get_active_mesh
from monarch_kernel.tensor._client import TensorClient, client_of
from monarch_kernel.tensor._tensor import MeshSliceTensor, Tensor, _Args, _fake_mode, _new, _rank_at

# -- rank tensors ---------------------------------------------------------------------------


def rank_tensor(mesh: ProcMesh, dims: str | Sequence[str]) -> Tensor:
    """A 0-d long tensor on ``mesh``: each proc's index along ``dims`` (row-major over several)."""
    names = [dims] if isinstance(dims, str) else list(dims)
    shape = mesh._shape
    shape.size(names)  # (names a dimension the mesh lacks: DimensionError)
    client = client_of(mesh)
    with _fake_mode:
        fake = torch.zeros((), dtype=torch.long)
    t = _new(client, mesh, fake)
    client.send(shape, (C.RANK, t._ref, shape, names))
    return t


# -- collectives ----------------------------------------------------------------------------


def reduce(tensors: Any, dims: Any, reduction: str = "sum", scatter: bool = False, mesh: Any = None) -> Any:
    """``Tensor.reduce`` for every mesh tensor in a pytree."""
    return pytree.tree_map(
        lambda x: x.reduce(dims, reduction, scatter, mesh) if isinstance(x, Tensor) else x, tensors
    )


def reduce_(tensors: Any, dims: Any, reduction: str = "sum", scatter: bool = False, mesh: Any = None) -> Any:
    """``Tensor.reduce_`` for every mesh tensor in a pytree."""
    return pytree.tree_map(
        lambda x: x.reduce_(dims, reduction, scatter, mesh) if isinstance(x, Tensor) else x, tensors
    )


# -- moving between meshes ------------------------------------------------------------------


def to_mesh(tensors: Any, mesh: ProcMesh, stream: Any = None) -> Any:
    """Moves every mesh tensor (or ``slice_mesh`` result) in a pytree to ``mesh``."""
    return pytree.tree_map(
        lambda x: x.to_mesh(mesh, stream) if isinstance(x, (Tensor, MeshSliceTensor)) else x,
        tensors,
        is_leaf=lambda x: isinstance(x, MeshSliceTensor),
    )


def slice_mesh(tensors: Any, **dims: int | slice) -> Any:
    """``Tensor.slice_mesh`` for every mesh tensor in a pytree."""
    return pytree.tree_map(lambda x: x.slice_mesh(**dims) if isinstance(x, Tensor) else x, tensors)


# -- sync points ------------------------------------------------------------------------------


def _tensors_of(obj: Any) -> tuple[list[Any], Any, list[Tensor]]:
    leaves, spec = pytree.tree_flatten(obj)
    return leaves, spec, [x for x in leaves if isinstance(x, Tensor)]


def _unwire(item: tuple[Any, ...], mesh: str) -> Any:
    """A fetched value as the engine sent it (``_engine.fetch``); raises its failure."""
    if not item[0]:
        _raise_failed(item[1], mesh)
    if item[1] == "raw":
        _, _, data, dtype, shape = item
        dt = getattr(torch, dtype)
        if not data:
            return torch.empty(shape, dtype=dt)
        return torch.frombuffer(bytearray(data), dtype=dt).reshape(shape)
    return item[2]


def _raise_failed(got: dict[str, Any], mesh: str) -> None:
    raise RemoteException(got["op"], got["rank"], got["message"], got["trace"], mesh)


def fetch_shard(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> Future[Any]:
    """A Future of ``obj`` with each mesh tensor replaced by its value on one proc:
    the one at coordinates ``shard`` (and ``kwargs``) of its mesh; dimensions not
    named are 0. Values come through the transfer engine, out of band."""
    coords = dict(shard or {}, **kwargs)
    if type(obj) is Tensor:  # the common case, without a walk over a tree
        leaves, spec, tensors = [obj], None, [obj]
    else:
        leaves, spec, tensors = _tensors_of(obj)
    if not tensors:
        return Future._resolved(obj)
    mesh = tensors[0]._mesh
    for t in tensors[1:]:
        if t._mesh._shape != mesh._shape:
            raise MeshTensorError(
                "fetch_shard: the tensors are on different meshes; fetch them one mesh at a time"
            )
    client = tensors[0]._client
    for t in tensors:
        client.check(t._gen)
    rank = _rank_at(mesh._shape, coords)
    client.flush()
    inner = client.fetcher(rank).call_one([t._ref for t in tensors])
    name = mesh.name

    def finish(replies: list[Any]) -> Any:
        got = inner._finish(replies)
        values = iter(got)
        out = []
        for x in leaves:
            out.append(_unwire(next(values), name) if isinstance(x, Tensor) else x)
        return out[0] if spec is None else pytree.tree_unflatten(out, spec)

    return Future(_calls=inner._calls, _finish=finish, _where=inner._where)


def inspect(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> Any:
    """``fetch_shard(obj, shard, **kwargs).result()``: one proc's values, here."""
    return fetch_shard(obj, shard, **kwargs).result()


class TensorView:
    """``show()``'s per-rank view of a mesh tensor: ranks with the same value share a row."""

    def __init__(self, tensor: Tensor, rows: list[tuple[list[int], str]]) -> None:
        self.tensor, self.rows = tensor, rows

    def _label(self, ranks: list[int]) -> str:
        return ranks_span(ranks)

    def __repr__(self) -> str:
        head = repr(self.tensor)
        return "\n".join([head, *(f"  {self._label(r)}: {v}" for r, v in self.rows)])

    def _repr_html_(self) -> str:
        import html

        rows = "".join(
            f"<tr><td style='text-align:left'>{html.escape(self._label(r))}</td>"
            f"<td style='text-align:left'><code>{html.escape(v)}</code></td></tr>"
            for r, v in self.rows
        )
        return f"<div><code>{html.escape(repr(self.tensor))}</code><table>{rows}</table></div>"


def show(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> Any:
    """Shows a mesh tensor in the notebook: with coordinates, that proc's value;
    without, a compact per-rank view (ranks with equal values grouped). Returns None
    (what is shown goes to the notebook, or to stdout outside IPython)."""
    if not isinstance(obj, Tensor) or shard or kwargs:
        value = inspect(obj, shard, **kwargs)
        _display(value)
        return None
    obj._client.check(obj._gen)
    obj._client.flush()
    lines = obj._client.engine_at(obj._mesh._shape).summary.call(obj._ref).get()
    rows: dict[str, list[int]] = {}
    for i, line in enumerate(lines.values()):
        if isinstance(line, dict):  # poisoned on this rank
            _raise_failed(line, obj._mesh.name)
        rows.setdefault(line, []).append(i)
    view = TensorView(obj, [(ranks, line) for line, ranks in rows.items()])
    _display(view)
    return None


def _display(value: Any) -> None:
    try:
        from IPython import get_ipython  # type: ignore[attr-defined]
        from IPython.display import display

        if get_ipython() is not None:
            display(value)
            return
    except ImportError:
        pass
    print(value)


# -- remote functions -------------------------------------------------------------------------


class Remote:
    """A function run on the procs of the active mesh (or of its tensor arguments)
    with mesh tensors as values; returns mesh tensors (Monarch's ``remote``)."""

    def __init__(self, fn: Any, propagate: Any) -> None:
        self.fn, self.propagate = fn, propagate
        self._cache: dict[Any, Any] = {}
        if callable(fn):
            functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        a = _Args()
        key: list[Any] = []
        enc_args = a.walk(args, key)
        enc_kwargs = a.walk(kwargs, key)
        mesh = a.mesh if a.mesh is not None else active_mesh()
        if mesh is None:
            raise MeshTensorError(f"remote {self._what()}: no mesh: activate one, or pass a mesh tensor")
        client = a.tensors[0]._client if a.tensors else client_of(mesh)
        shape = mesh._shape
        if self.propagate == "inspect":
            client.send(shape, (C.CALL, self.fn, enc_args, enc_kwargs, []))
            return None
        if callable(self.propagate):
            fargs = pytree.tree_map(lambda x: x._fake() if isinstance(x, Tensor) else x, (args, kwargs))
            with _fake_mode:
                fake_out = self.propagate(*fargs[0], **fargs[1])
            return self._emit(client, mesh, enc_args, enc_kwargs, fake_out)
        if self.propagate not in (None, "cached"):
            raise ValueError(f"remote(propagate={self.propagate!r}): use a function, 'cached' or 'inspect'")
        try:
            ck: Any = tuple(key)
            hash(ck)
        except TypeError:
            ck = None
        known = self._cache.get(ck) if ck is not None else None
        if known is not None:
            return self._emit_known(client, mesh, enc_args, enc_kwargs, known)
        # First call with these argument kinds: run it, then ask the first proc what it made.
        tree = client.new_id()
        client.send(shape, (C.CALL, self.fn, enc_args, enc_kwargs, tree))
        client.flush()
        got = client.engine_at_rank(shape.ranks[0]).describe.call_one(tree).get()
        if isinstance(got, dict):
            client.send(shape, (C.DEL, [tree]))
            _raise_failed(got, mesh.name)
        metas, spec = got
        known = (metas, spec)
        if ck is not None:
            self._cache[ck] = known
        leaves, outs = self._leaves(client, mesh, metas)
        client.send(shape, (C.UNPACK, tree, outs))
        return pytree.tree_unflatten(leaves, spec)

    def _what(self) -> str:
        return self.fn if isinstance(self.fn, str) else getattr(self.fn, "__qualname__", repr(self.fn))

    # -- as an endpoint: Monarch's free remote functions ---------------------------------

    def free_function_endpoint(self, adverb: str = "call") -> Any:
        """The endpoint that runs this function as a free function on every proc of
        the active mesh (``monarch_kernel.tensor._free``)."""
        from monarch_kernel.tensor._free import run_endpoint

        mesh = active_mesh()
        if mesh is None:
            raise MeshTensorError(
                f"remote {self._what()}.{adverb}(): no mesh is active; call it under `with procs.activate():`"
            )
        return run_endpoint(mesh)

    def call(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Runs the function on every proc of the active mesh: a ``ValueMesh`` of what
        each returned (as an endpoint's ``call``)."""
        return self.free_function_endpoint("call").call(self.fn, args, kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """As ``call``, on an active mesh of one proc: its value."""
        return self.free_function_endpoint("call_one").call_one(self.fn, args, kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """As ``call``, on one proc of the active mesh: its value."""
        return self.free_function_endpoint("choose").choose(self.fn, args, kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Runs the function on every proc of the active mesh; no answer."""
        self.free_function_endpoint("broadcast").broadcast(self.fn, args, kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        """As ``call``, each proc's value as it comes."""
        return self.free_function_endpoint("stream").stream(self.fn, args, kwargs)

    def _leaves(self, client: TensorClient, mesh: ProcMesh, metas: list[Any]) -> tuple[list[Any], list[Any]]:
        leaves: list[Any] = []
        outs: list[Any] = []
        for m in metas:
            if m[0] == "t":
                ref = client.new_id()
                leaves.append(Tensor(m[1], m[2], 0, m[3], torch.device(m[4]), mesh, client, ref))
                outs.append(ref)
            else:
                leaves.append(m[1])
                outs.append(None)
        return leaves, outs

    def _emit_known(self, client: TensorClient, mesh: ProcMesh, a: Any, k: Any, known: Any) -> Any:
        metas, spec = known
        leaves, outs = self._leaves(client, mesh, metas)
        client.send(mesh._shape, (C.CALL, self.fn, a, k, outs))
        return pytree.tree_unflatten(leaves, spec)

    def _emit(self, client: TensorClient, mesh: ProcMesh, a: Any, k: Any, fake_out: Any) -> Any:
        leaves, spec = pytree.tree_flatten(fake_out)
        out_leaves: list[Any] = []
        outs: list[Any] = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                t = _new(client, mesh, x)
                out_leaves.append(t)
                outs.append(t._ref)
            else:
                out_leaves.append(x)
                outs.append(None)
        client.send(mesh._shape, (C.CALL, self.fn, a, k, outs))
        return pytree.tree_unflatten(out_leaves, spec)


def rref(endpoint: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``Endpoint.rref``: the endpoint run on every proc of the active mesh, in order
    with its tensor ops; what each proc's actor returns, as a mesh tensor. Its
    ``@endpoint(propagate=fn)`` says what it returns without waiting for the procs,
    as in Monarch (an error then poisons the result, raised where it is used);
    without one, the first proc is asked once. The actors must be on exactly the
    active mesh's procs."""
    from monarch_kernel.tensor._free import invoke_local_actor

    mesh, actors = active_mesh(), endpoint._mesh
    if (
        mesh is None
        or mesh._proc.token != actors._proc.token
        or tuple(mesh._shape.ranks) != tuple(actors._shape.ranks)
    ):
        raise MeshTensorError(
            f"{actors._name}.{endpoint._name}.rref(): call it under `with procs.activate():` of the procs "
            "its actors are on (the same mesh or slice)"
        )
    propagate = endpoint._prop._propagator
    if callable(propagate):
        invoke = Remote(invoke_local_actor, lambda _actor, _method, *a, **k: propagate(*a, **k))
    else:
        invoke = _invokes.setdefault((actors._name, endpoint._name), Remote(invoke_local_actor, None))
    return invoke(actors._name, endpoint._name, *args, **kwargs)


#: ``invoke_local_actor`` as a tensor op, by (actor, endpoint): what it returns is
#: asked of the first proc once per kind of arguments.
_invokes: dict[tuple[str, str], Any] = {}


def remote(function: Any = None, *, propagate: Any = None) -> Any:
    """Makes ``function`` (or "module.function") run on the procs: ``propagate`` says
    what it returns without running it here: a function computing the result from
    fake inputs, "inspect" (nothing: run for its effects), or None/"cached" (the
    first call with given argument shapes asks the first proc, later ones reuse it)."""
    if function is None:
        return functools.partial(remote, propagate=propagate)
    return Remote(function, propagate)


# -- autograd, batching ------------------------------------------------------------------------


def grad_generator(
    roots: Any = (), with_respect_to: Sequence[Any] = (), grad_roots: Any = ()
) -> Iterator[Any]:
    """The gradients of ``roots`` with respect to each of ``with_respect_to``, one at
    a time, in that order (Monarch's ``grad_generator``). The backward ops are issued
    together when the first is asked for; they run on the procs in order, so work
    on an early gradient (a ``reduce_``) is issued while later ones compute."""
    wrt = list(with_respect_to)
    roots_l = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    grads_l = [grad_roots] if isinstance(grad_roots, torch.Tensor) else list(grad_roots)
    grads = torch.autograd.grad(roots_l, wrt, grad_outputs=grads_l or None, allow_unused=True)
    yield from grads


@contextlib.contextmanager
def coalescing() -> Iterator[None]:
    """Holds the active mesh's commands back until the block ends, then sends them
    together (they are batched anyway; this only stops the quiet flush)."""
    mesh = get_active_mesh()
    client = client_of(mesh)
    client.held += 1
    try:
        yield
    finally:
        client.held -= 1
        client.flush(deletes=False)


def memory(mesh: ProcMesh) -> dict[int, dict[str, int]]:
    """Bytes of tensor memory each proc of ``mesh`` holds for the tensor engine, by rank."""
    client = client_of(mesh)
    client.flush()
    got = client.engine_at(mesh._shape).memory.call().get()
    return {mesh._shape.ranks[i]: v for i, v in enumerate(got.values())}
