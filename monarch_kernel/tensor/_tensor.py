"""``Tensor``: a tensor that lives on the procs of a mesh (one per proc), handled in
the controller as if it were local. (``activate()``, under which torch code runs on
the mesh, is in ``_activate``.)

The controller never holds the data. A mesh tensor is a wrapper subclass that carries
only metadata (shape, strides, dtype, device); every aten op on it, or any op while a
mesh is active, goes through ``run_op``: the result's metadata comes from running the
op on fake tensors (``FakeTensorMode``, cached per op and argument metadata), and the
op itself becomes one command for the procs (``_commands``). Autograd sits above the
dispatcher, so ``backward()`` issues its ops the same way.

TENSOR-3: the controller refuses locally what torch would refuse (a shape error is
raised at the line that made it, from the fake run); what fails only on the procs
is reported at the next sync point that depends on it (TENSOR-1).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from monarch_kernel.errors import MeshTensorError
from monarch_kernel.mesh import ProcMesh, Shape
from monarch_kernel.tensor import _commands as C
from monarch_kernel.tensor._client import TensorClient, client_of
from monarch_kernel.tensor._stream import default_stream

_fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
#: Per (op, argument metadata): how to make the result without a fake run.
_meta_cache: dict[Any, Any] = {}
_names: dict[Any, str] = {}


class Tensor(torch.Tensor):
    """A tensor with one value on each proc of ``mesh`` (Monarch's ``monarch.Tensor``)."""

    _ref: int
    _client: TensorClient
    _mesh: ProcMesh
    _gen: int
    _stream: Any
    _fake_t: Any

    @staticmethod
    def __new__(
        cls,
        size: Any,
        stride: Any,
        offset: int,
        dtype: Any,
        device: Any,
        mesh: ProcMesh,
        client: TensorClient,
        ref: int,
        stream: Any = None,
    ) -> Tensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=dtype, device=device, requires_grad=False
        )
        r._ref, r._client, r._mesh, r._gen, r._stream, r._fake_t = ref, client, mesh, client.gen, stream, None
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        return run_op(func, args, kwargs or {})

    def __del__(self) -> None:
        try:
            self._client.deleted.append(self._ref)
        except AttributeError:  # never finished __new__
            pass

    @property
    def mesh(self) -> ProcMesh:
        """The procs this tensor lives on."""
        return self._mesh

    @property
    def stream(self) -> Any:
        return self._stream or default_stream()

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        grad = ", requires_grad=True" if self.requires_grad else ""
        dtype = str(self.dtype).replace("torch.", "")
        return (
            f"monarch_kernel.Tensor(shape={tuple(self.shape)}, dtype={dtype}, device={self.device}{grad}, "
            f"mesh={self._mesh.name!r} {self._mesh._shape.extent})"
        )

    def _held_elsewhere(self, what: str) -> MeshTensorError:
        return MeshTensorError(
            f"{what}: this tensor's values are on the procs of mesh {self._mesh.name!r}, not here. "
            "monarch_kernel.inspect(t) (or fetch_shard) brings one proc's value; "
            "monarch_kernel.remote(fn) runs code on the procs"
        )

    def tolist(self) -> Any:  # type: ignore[override]
        raise self._held_elsewhere("tolist()")

    def numpy(self, *, force: bool = False) -> Any:  # type: ignore[override]
        raise self._held_elsewhere("numpy()")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise self._held_elsewhere("numpy conversion")

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        """A copy on the procs (``copy.deepcopy(model)`` of a module on the mesh)."""
        with torch.no_grad():
            c = self.clone()
        c.requires_grad_(self.requires_grad)
        if getattr(self, "_is_param", False):
            c._is_param = True  # type: ignore[attr-defined]
        memo[id(self)] = c
        return c

    def __reduce_ex__(self, protocol: Any) -> Any:  # type: ignore[override]
        """A call to actors of this tensor's own mesh gives each its proc's shard (as in
        Monarch): every proc first runs the commands that make it (one round trip),
        then the tensor travels as its ref. Anywhere else its values are not here."""
        from monarch_kernel.mesh import calling_token
        from monarch_kernel.tensor._engine import shard_here

        if calling_token() != self._mesh._proc.token:
            raise self._held_elsewhere(
                "pickling a mesh tensor for a process that is not one of its mesh's procs"
            )
        self._client.flush()
        self._client.engine_at(self._mesh._shape).memory.call().get()  # (ordered after every command)
        return (shard_here, (int(self._ref), self._mesh.name))

    def _fake(self) -> Any:
        f = self._fake_t
        if f is None:
            with _fake_mode:
                if self.storage_offset() == 0:
                    f = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device=self.device)
                else:
                    need = self.storage_offset() + _extent(self.shape, self.stride())
                    base = torch.empty(need, dtype=self.dtype, device=self.device)
                    f = base.as_strided(self.shape, self.stride(), self.storage_offset())
            self._fake_t = f
        return f

    def reduce(
        self,
        dims: str | tuple[str, ...] | list[str],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
        _inplace: bool = False,
        out: Any = None,
    ) -> Tensor:
        """A collective over mesh dimensions ``dims`` (Monarch's meaning): ``sum``,
        ``avg``, ``product``, ``min``, ``max``, ``band``, ``bor``, ``bxor`` all-reduce
        (``scatter=True``: reduce-scatter along the tensor's first dimension), and
        ``stack`` all-gathers into a new first dimension (``scatter=True``: all-to-all)."""
        return reduce_tensor(self, dims, reduction, scatter, mesh, _inplace, out)

    def reduce_(
        self,
        dims: str | tuple[str, ...] | list[str],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
    ) -> Tensor:
        """``reduce`` in place."""
        return self.reduce(dims, reduction, scatter, mesh, _inplace=True)

    def to_mesh(self, mesh: ProcMesh, stream: Any = None) -> Tensor:
        """This tensor moved to ``mesh`` (dimensions matched by name; ``mesh``'s extra
        dimensions receive a copy), proc to proc."""
        return move(self, self._mesh._shape, mesh, stream)

    def slice_mesh(self, **dims: int | slice) -> MeshSliceTensor:
        """The part of this tensor on a slice of its mesh (for ``to_mesh``)."""
        return MeshSliceTensor(self, self._mesh._shape.slice(**dims))

    def drop(self) -> None:
        """Frees the procs' memory now (the tensor cannot be used after)."""
        self._client.deleted.append(self._ref)
        self._ref = -1


class MeshSliceTensor:
    """A mesh tensor seen on a slice of its mesh (``Tensor.slice_mesh``)."""

    def __init__(self, tensor: Tensor, shape: Any) -> None:
        self.tensor, self.shape = tensor, shape

    def to_mesh(self, mesh: ProcMesh, stream: Any = None) -> Tensor:
        return move(self.tensor, self.shape, mesh, stream)


_ranks_at: dict[Any, int] = {}


def _rank_at(shape: Shape, shard: dict[str, int]) -> int:
    """The proc rank at coordinates ``shard`` of ``shape`` (dimensions not named: 0)."""
    if not shard:
        return shape.ranks[0]
    key = (shape, tuple(sorted(shard.items())))
    rank = _ranks_at.get(key)
    if rank is None:
        for d in shard:
            shape._check_dim(d)
        coords = {d: shard.get(d, 0) for d in shape.labels}
        rank = shape.slice(**coords).ranks[0] if coords else shape.ranks[0]
        if len(_ranks_at) < 4096:
            _ranks_at[key] = rank
    return rank


def _extent(shape: Any, stride: Any) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else 0


# -- collectives and moves (Tensor.reduce, Tensor.to_mesh) ------------------------


def _new(client: TensorClient, mesh: ProcMesh, fake: Any, stream: Any = None) -> Tensor:
    return Tensor(
        fake.shape,
        fake.stride(),
        fake.storage_offset(),
        fake.dtype,
        fake.device,
        mesh,
        client,
        client.new_id(),
        stream,
    )


def _fake_reduce(x: Any, n: int, reduction: str, scatter: bool) -> Any:
    if scatter:
        if x.ndim == 0 or x.size(0) != n:
            raise ValueError(
                f"reduce(scatter=True) splits the tensor's first dimension across the {n} procs: its shape "
                f"{list(x.shape)} must start with {n}"
            )
        return x if reduction == "stack" else x.sum(dim=0)
    if reduction == "stack":
        return torch.empty([n, *x.shape], dtype=x.dtype, device=x.device)
    return x.add(x)


def reduce_tensor(
    t: Tensor, dims: Any, reduction: str, scatter: bool, mesh: Any, inplace: bool, out: Any
) -> Tensor:
    if mesh is not None:
        raise NotImplementedError("reduce(mesh=...) is not supported: reduce, then use to_mesh")
    shape = t._mesh._shape
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    if not names:
        names = shape.labels
    n = shape.size(list(names))  # (names a dimension the mesh lacks: DimensionError)
    if len(set(names)) != len(names):
        raise ValueError(f"reducing the same dimension twice: {names}")
    if len(names) > 1 and (reduction == "stack" or scatter):
        raise ValueError(
            f"reduction {reduction!r} or scatter=True is not valid over several dimensions {names}"
        )
    if reduction not in C.REDUCTIONS:
        raise ValueError(
            f"reduction {reduction!r} is not supported; the reductions are {', '.join(C.REDUCTIONS)}"
        )
    if t.requires_grad and torch.is_grad_enabled():
        raise MeshTensorError(
            "reduce() of a tensor that requires grad: collectives are not differentiated. Reduce under "
            "torch.no_grad() (the gradients, say), or .detach() first"
        )
    if inplace:
        if scatter and reduction != "stack":
            raise ValueError(
                f"reduction {reduction!r} with scatter=True changes the shape: it cannot be in place"
            )
        fake = t._fake()
    else:
        fake = _fake_reduce(t._fake(), n, reduction, scatter)
        if out is not None and tuple(out.shape) != tuple(fake.shape):
            raise ValueError(f"out has shape {tuple(out.shape)}; reduce makes {tuple(fake.shape)}")
    client = t._client
    key = client.group(shape, names)
    r = t if inplace else (out if out is not None else _new(client, t._mesh, fake, t._stream))
    client.send(
        shape,
        (C.REDUCE, r._ref, t._ref, key, reduction, scatter, inplace, str(t.device)),
    )
    if out is not None and not inplace:
        return out
    return r


def move(t: Tensor, src: Shape, mesh: ProcMesh, stream: Any = None) -> Tensor:
    """``t`` (seen on ``src``, its mesh or a slice of it) on ``mesh``: dimensions are
    matched by name and must have one size; ``mesh``'s other dimensions get copies."""
    if t.requires_grad and torch.is_grad_enabled():
        raise MeshTensorError(
            "to_mesh() of a tensor that requires grad: use torch.no_grad() or .detach() first"
        )
    if mesh._proc.token != t._mesh._proc.token:
        raise MeshTensorError(
            f"to_mesh: mesh {mesh.name!r} is not part of mesh {t._mesh.name!r}; tensors move between slices "
            "of one proc mesh"
        )
    dest = mesh._shape
    missing = [d for d in src.labels if d not in dest.labels]
    if missing:
        raise ValueError(f"to_mesh: the destination mesh {dest.extent} has no dimension(s) {missing}")
    for d in src.labels:
        if dest.extent[d] != src.extent[d]:
            raise ValueError(
                f"to_mesh: dimension {d!r} has {src.extent[d]} procs here and {dest.extent[d]} on the destination"
            )
    routes: dict[int, list[int]] = {}
    sources: dict[int, int] = {}
    for point in dest.points():
        s = _rank_at(src, {d: point[d] for d in src.labels})
        d_rank = dest.ranks[point.rank]
        routes.setdefault(s, []).append(d_rank)
        sources[d_rank] = s
    client = t._client
    with _fake_mode:
        fake = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    r = _new(client, mesh, fake, stream)
    prefix = uuid.uuid4().hex[:12]
    client.send(t._mesh._shape, (C.SEND, t._ref, prefix, routes))
    client.send(dest, (C.RECV, r._ref, prefix, sources))
    return r


# -- one op -----------------------------------------------------------------------------


def _same_mesh(a: ProcMesh, b: ProcMesh) -> bool:
    return a is b or (a._proc.token == b._proc.token and a._shape == b._shape)


class _Args:
    """One walk over an op's arguments: the cache key, the arguments as a command
    carries them (refs for mesh tensors), the mesh tensors, and their mesh."""

    __slots__ = ("tensors", "mesh", "local")

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.mesh: ProcMesh | None = None
        #: A local tensor is among the arguments.
        self.local = False

    def walk(self, x: Any, key: list[Any]) -> Any:
        t = type(x)
        if t is Tensor:
            if self.mesh is None:
                self.mesh = x._mesh
            elif not _same_mesh(self.mesh, x._mesh):
                raise MeshTensorError(
                    f"an op mixes tensors of two meshes: {self.mesh.name!r} {self.mesh._shape.extent} and "
                    f"{x._mesh.name!r} {x._mesh._shape.extent}. Move one with t.to_mesh(mesh) first."
                )
            if x._ref < 0:
                raise MeshTensorError(
                    "this mesh tensor was dropped (Tensor.drop()); it cannot be used any more"
                )
            self.tensors.append(x)
            key.append((x.shape, x.stride(), x.storage_offset(), x.dtype, x.device))
            return C.Ref(x._ref)
        if t is tuple or t is list:
            sub: list[Any] = [t]
            out = t(self.walk(y, sub) for y in x)
            key.append(tuple(sub))
            return out
        if t is dict:
            sub = [dict]
            out = {}
            for k, v in x.items():
                sub.append(k)
                out[k] = self.walk(v, sub)
            key.append(tuple(sub))
            return out
        if isinstance(x, torch.Tensor):  # a local tensor: a constant, sent with the command
            self.local = True
            key.append(("local", x.shape, x.dtype, x.device))
            return x.detach()
        key.append((t, x))
        return x


def _fake_of(x: Any) -> Any:
    return x._fake() if type(x) is Tensor else x


def _meta_of(func: Any, args: Any, kwargs: Any, inputs: list[Tensor]) -> tuple[Any, list[Any]]:
    """Runs ``func`` on fakes: the result's tree spec and, per leaf, ("new", size,
    stride, offset, dtype, device), ("alias", i) (it is input ``i``) or ("value", v)."""
    fargs = pytree.tree_map(_fake_of, args)
    fkwargs = pytree.tree_map(_fake_of, kwargs)
    try:
        with _fake_mode, _quiet_fake_log():
            out = func(*fargs, **fkwargs)
    except Exception as e:
        name = type(e).__name__
        if "DataDependent" in name or "DynamicOutputShape" in name:
            raise MeshTensorError(
                f"{_name(func)} needs the tensor's values in the controller, which holds none: "
                "fetch one proc's value with monarch_kernel.inspect(t) (or fetch_shard), or run the code on "
                "the procs with monarch_kernel.remote(fn)"
            ) from None
        raise e.with_traceback(None) from None  # torch's error, as torch would raise it here
    leaves, spec = pytree.tree_flatten(out)
    fakes = [i._fake_t for i in inputs]
    specs: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            alias = next((i for i, f in enumerate(fakes) if f is leaf), None)
            if alias is not None:
                specs.append(("alias", alias))
            else:
                specs.append(
                    ("new", leaf.shape, leaf.stride(), leaf.storage_offset(), leaf.dtype, leaf.device)
                )
        else:
            specs.append(("value", leaf))
    return spec, specs


_local = threading.local()


class _DropFakeErrors(logging.Filter):
    """Drops the fake tensor mode's own log of an op that failed on fakes while this
    module runs one: the error is raised to the user, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_local, "faking", False)


logging.getLogger("torch._subclasses.fake_tensor").addFilter(_DropFakeErrors())


@contextlib.contextmanager
def _quiet_fake_log() -> Iterator[None]:
    _local.faking = True
    try:
        yield
    finally:
        _local.faking = False


def _name(func: Any) -> str:
    n = _names.get(func)
    if n is None:
        n = _names[func] = C.op_name(func)
    return n


#: ``torch.tensor(data)`` under ``activate()`` makes a local tensor and lifts it: the
#: lift makes it a mesh tensor (the data travels with the command).
_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)


def run_op(func: Any, args: Any, kwargs: Any, active: ProcMesh | None = None) -> Any:
    """Issues ``func(*args, **kwargs)`` on the procs and returns its mesh tensors."""
    a = _Args()
    key: list[Any] = [func]
    enc_args = a.walk(tuple(args), key)
    enc_kwargs = a.walk(kwargs, key) if kwargs else {}
    mesh = a.mesh
    if active is not None:
        if mesh is None:
            if a.local and func not in _LIFTS:  # local tensors stay local (printing one, say)
                return func(*args, **kwargs)
            mesh = active
        elif not _same_mesh(mesh, active):
            raise MeshTensorError(
                f"{_name(func)}: a tensor of mesh {mesh.name!r} {mesh._shape.extent} is used while mesh "
                f"{active.name!r} {active._shape.extent} is active. Move it with t.to_mesh(mesh), or "
                "activate its mesh."
            )
    if mesh is None:  # (never from a Tensor's own dispatch: it has a mesh)
        return func(*args, **kwargs)
    try:
        k: Any = tuple(key)
        hit = _meta_cache.get(k)
    except TypeError:  # an unhashable argument: no cache
        k, hit = None, None
    if hit is None:
        for t in a.tensors:
            t._fake()
        hit = _meta_of(func, args, kwargs, a.tensors)
        if k is not None:
            _meta_cache[k] = hit
    spec, specs = hit
    client = client_of(mesh) if not a.tensors else a.tensors[0]._client
    stream = a.tensors[0]._stream if a.tensors else None
    leaves: list[Any] = []
    outs: list[int | None] = []
    for s in specs:
        kind = s[0]
        if kind == "new":
            ref = client.new_id()
            leaves.append(Tensor(s[1], s[2], s[3], s[4], s[5], mesh, client, ref, stream))
            outs.append(ref)
        elif kind == "alias":
            t = a.tensors[s[1]]
            leaves.append(t)
            outs.append(t._ref)
        else:
            leaves.append(s[1])
            outs.append(None)
    client.send(mesh._shape, (C.OP, _name(func), enc_args, enc_kwargs, outs))
    return pytree.tree_unflatten(leaves, spec)
