"""``ActorMesh`` and its endpoints' adverbs: ``call``, ``call_one``, ``broadcast``,
``choose``, ``stream``.

A call to N ranks is one native call: the fan-out and the gather happen in the native
runtime with the GIL released.
"""

from __future__ import annotations

import inspect
import pickle
import random
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from monarch_kernel import _native, _origin
from monarch_kernel._wire import ACTOR_FAILED
from monarch_kernel.actor import EndpointProperty, endpoints_of
from monarch_kernel.errors import (
    ActorError,
    MeshIndexError,
    MeshSpecError,
    MeshTensorError,
    SerializationError,
    SupervisionError,
    UnknownEndpointError,
)
from monarch_kernel.mesh import _buffers, _port
from monarch_kernel.mesh._builtin import send_calls
from monarch_kernel.mesh._control import session_for
from monarch_kernel.mesh._future import Future, cancel_calls
from monarch_kernel.mesh._serial import dumps, loads, loads_exception
from monarch_kernel.mesh._shape import MeshTrait, Point, Shape
from monarch_kernel.mesh._value_mesh import ValueMesh

if TYPE_CHECKING:
    from monarch_kernel.mesh._proc_ref import ProcRef

R = TypeVar("R")

#: Longest a call waits for its receivers to pull its large buffers (XFER-2).
SEND_WAIT_S = 60.0
_RESULT = _native.REPLY_RESULT
_EXCEPTION = _native.REPLY_EXCEPTION
_FENCED = _native.REPLY_FENCED


def decode_reply(
    reply: Any,
    proc: ProcRef,
    base_rank: int,
    point: Point,
    what: str,
    *,
    failed: str | None = None,
    value: bool = True,
) -> Any:
    """Turns one reply from ``wait_all`` into its value, or raises what it means: the
    one decoding of replies. ``failed``: what an ``ActorError`` says (default: "Actor
    call WHAT failed."); ``value=False``: a reply that carries no value (a spawn)."""
    if isinstance(reply, BaseException):
        raise proc.explain(reply, base_rank, what) from None
    kind, payload, buffers = reply.kind, reply.payload, reply.buffers
    if kind == _RESULT:
        if not value:
            return None
        try:
            return loads(payload, buffers, proc.token)
        except Exception as e:
            raise SerializationError(
                f"cannot unpickle the result of {what} from rank {point}: {type(e).__name__}: {e}. "
                "Return values whose classes the controller can import (or define them in the notebook)."
            ) from e
    if kind == _EXCEPTION:
        exc, formatted = loads_exception(payload, buffers, proc.token)
        raise ActorError(exc, failed or f"Actor call {what} failed.", formatted, rank=proc.point(base_rank))
    if kind == _FENCED:
        raise proc.fenced(bytes(payload).decode("utf-8", "replace"), base_rank, what)
    text = bytes(payload).decode("utf-8", "replace")
    if text.startswith(ACTOR_FAILED):  # DISPATCH-4: the actor itself failed
        raise SupervisionError(
            f"Endpoint call {what}() failed, {text[len(ACTOR_FAILED) :]}", mesh=proc.name, rank=base_rank
        )
    raise proc.rejected(text, base_rank, what)


def decode_all(
    replies: list[Any],
    proc: ProcRef,
    ranks: Sequence[int],
    point_of: Callable[[int], Point],
    what: str,
    **kw: Any,
) -> list[Any]:
    """Decodes the replies of a call to several ranks, in rank order; but first, a rank
    whose call failed (its worker died) raises, even while other ranks still run
    (their entries are None: ``wait_calls`` returned at the first failure).
    ``point_of(i)``: the point of reply ``i``, made only for an error that names it."""
    n = len(replies)
    if not kw and n > 1 and not isinstance(replies[0], BaseException) and replies.count(replies[0]) == n:
        # one Reply for every rank (``wait_all`` shares equal ones): read once
        values = _plain_values(replies[:1])
        if values is not None and type(values[0]) in _ATOMS:
            return values * n
    for i, r in enumerate(replies):
        if isinstance(r, BaseException):
            decode_reply(r, proc, ranks[i], point_of(i), what, **kw)  # raises
    if not kw:
        values = _plain_values(replies)
        if values is not None:
            return values
    return [decode_reply(r, proc, ranks[i], point_of(i), what, **kw) for i, r in enumerate(replies)]


#: Types whose values are never changed in place: one unpickled copy can stand for
#: every rank that sent the same bytes.
_ATOMS = frozenset({int, float, bool, str, bytes, type(None), complex})
_UNSEEN = object()


def _plain_values(replies: list[Any]) -> list[Any] | None:
    """TREE-1's per-reply cost: the values of replies that are all plain results (no
    out-of-band buffer, nothing transferred), with each distinct payload of an
    immutable value unpickled once (1,024 ranks that return the same loss cost one
    ``pickle.loads``); None when any reply needs :func:`decode_reply`."""
    seen: dict[bytes, Any] = {}
    out = []
    last: Any = None
    v: Any = None
    for r in replies:
        if r is last and type(v) in _ATOMS:  # the same Reply (``wait_all`` shares them)
            out.append(v)
            continue
        last = r
        payload = r.payload
        if r.kind != _RESULT or r.buffers or payload[:4] == _buffers.HEADER:
            return None
        v = seen.get(payload, _UNSEEN)
        if v is _UNSEEN:
            try:
                v = pickle.loads(payload)
            except Exception:
                return None  # decode_reply says what went wrong, for which rank
            if type(v) in _ATOMS:
                seen[payload] = v
        out.append(v)
    return out


def _finish_one(proc: ProcRef, base_rank: int, point: Point, what: str) -> Callable[[list[Any]], Any]:
    """Turns the one reply of a single-rank Future into its value."""
    return lambda replies: decode_reply(replies[0], proc, base_rank, point, what)


#: The tensor engine's ``rref`` (``monarch_kernel.tensor`` sets it as it loads, so
#: that this layer, below the tensor engine, need not import it).
_rref: list[Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]] = []


def set_rref(fn: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]) -> None:
    """Installs the tensor engine's ``Endpoint.rref``."""
    _rref[:] = [fn]


class Endpoint(Generic[R]):
    """An endpoint of an actor mesh: pick an adverb to call it."""

    def __init__(self, mesh: ActorMesh, name: str, prop: EndpointProperty[R]) -> None:
        self._mesh = mesh
        self._name = name
        self._prop = prop
        self._signature = _signature(prop)
        #: Where its calls go, converted once (the native side keeps it).
        self._target = _native.Endpoint(mesh._name, name, mesh._labels, mesh._sizes)
        self._positional = _positional_range(self._signature)
        # Made once, not per call (the call path reads them on every call).
        self._what = f"{mesh._name}.{name}"
        self._args_what = f"arguments of {self._what}"
        self._explicit: bool = prop._explicit_response_port

    def _send(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], local: Sequence[int], oneway: bool
    ) -> Sequence[Any]:
        lo, hi = self._positional
        if kwargs or not lo <= len(args) <= hi:  # the common case needs no bind()
            try:
                self._signature.bind(None, *args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{self._what}(): {e}") from None
        mesh = self._mesh
        if mesh._init_errors:  # an actor whose __init__ failed (supervision was told)
            for i in local:
                err = mesh._init_errors.get(mesh._shape.ranks[i])
                if err is not None:
                    raise err
        conns = mesh._conns()  # first: a dead rank fails before anything is registered
        if len(local) != len(conns):
            conns = [conns[i] for i in local]
        regs: list[int] = []
        live: list[int] = []
        payload, buffers = dumps((args, kwargs), self._args_what, mesh._proc.token, len(local), regs, live)
        origin = _origin.current()
        if origin:
            _origin.touched.add(mesh._proc.name)
        try:
            fan = mesh._proc.fanout()
            # (the procs' ranks only where the relays need them, not on a call's local
            # path; a call to the whole mesh passes the mesh's own tuples, which the
            # fan-out converts once, not per call: TREE-1)
            of = mesh._shape.ranks
            procs = local if fan is None else of if local is mesh._every else [of[i] for i in local]
            calls = send_calls(fan, self._target, conns, procs, local, payload, buffers, oneway, origin)
        except BaseException:
            _buffers.drop_now(regs)  # nothing was sent: nobody will read them
            raise
        _buffers.drop_when_done(calls, regs)
        # XFER-2: what the receivers get is what the buffers hold now, not after a
        # later in-place change: they pull as the call arrives, and this waits for it
        # (a broadcast has no replies to say a receiver is gone: its deaths do).
        if live:
            st, ranks = mesh._proc.state(), [mesh._shape.ranks[i] for i in local]
            try:
                _buffers.wait_read(
                    live, calls, SEND_WAIT_S, lambda: st.stopped or any(r in st.dead for r in ranks)
                )
            except BaseException:  # interrupted while the receivers pull: stop the calls too
                if calls:
                    cancel_calls(calls)
                raise
        return calls

    def _answered(
        self, local: Sequence[int], args: tuple[Any, ...], kwargs: dict[str, Any], expected: int, finish: Any
    ) -> Future[Any]:
        """ENDPOINT-1: calls the actors at ``local`` with a port of this process as
        their first argument; the Future settles from what arrives on it (``finish``
        of the first ``expected`` messages), or with the error of a call that failed."""
        port, out, fail = _port.call_port(expected, finish)
        calls = self._send((port, *args), kwargs, local, False)
        _port.fail_on_error(calls, self._decoder(local), fail)
        shape = self._mesh._shape
        return Future(
            _calls=calls,
            _local=out,
            _where=(self._mesh._proc.name, self._what, [shape.ranks[i] for i in local]),
        )

    def _decoder(self, local: Sequence[int]) -> Callable[[Any, int], Any]:
        """``decode(reply, i)``: the value of reply ``i`` of a call to ``local``, or the error it means."""
        shape, proc, what = self._mesh._shape, self._mesh._proc, self._what

        def decode(reply: Any, i: int) -> Any:
            return decode_reply(reply, proc, shape.ranks[local[i]], Point(local[i], shape.extent), what)

        return decode

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Calls every actor in the mesh; the Future gives a ValueMesh of the results."""
        shape = self._mesh._shape
        if self._explicit:
            local_shape = self._mesh._local
            n = len(shape)

            def by_rank(got: list[tuple[int | None, bool, Any]]) -> ValueMesh[R]:
                values: list[Any] = [None] * n
                for i, item in enumerate(got):
                    rank = item[0]
                    values[rank if rank is not None and 0 <= rank < n else i] = _port.value_of(item)
                return ValueMesh(local_shape, values)

            return self._answered(self._mesh._every, args, kwargs, n, by_rank)
        calls = self._send(args, kwargs, self._mesh._every, False)
        proc, what = self._mesh._proc, self._what
        local_shape = self._mesh._local

        def finish(replies: list[Any]) -> ValueMesh[R]:
            return ValueMesh(local_shape, decode_all(replies, proc, shape.ranks, local_shape.point, what))

        return Future(_calls=calls, _finish=finish, _where=(proc.name, what, shape.ranks))

    def _one(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[R]:
        shape = self._mesh._shape
        if self._explicit:
            return self._answered([i], args, kwargs, 1, lambda got: _port.value_of(got[0]))
        (c,) = self._send(args, kwargs, [i], False)
        proc = self._mesh._proc
        what = self._what
        finish = _finish_one(proc, shape.ranks[i], Point(i, shape.extent), what)
        return Future(_calls=[c], _finish=finish, _where=(proc.name, what, (shape.ranks[i],)))

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Calls the one actor of a single-actor mesh (slice first if needed)."""
        n = len(self._mesh._shape)
        if n != 1:
            raise ValueError(
                f"call_one requires exactly 1 actor, but mesh has {n} ({self._mesh._shape.extent}); "
                f"use .slice(...) to pick one, or .call() / .choose()"
            )
        return self._one(0, args, kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Calls one actor of the mesh, chosen at random."""
        if not len(self._mesh._shape):
            raise MeshIndexError(f"{self._what}.choose(): the mesh is empty (its slice selects no actors)")
        return self._one(random.randrange(len(self._mesh._shape)), args, kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Sends to every actor without waiting for replies (an exception goes to
        supervision: the mesh's ``on_failure``, else the notebook)."""
        if self._explicit:
            args = (_port.DroppingPort(), *args)
        self._send(args, kwargs, self._mesh._every, True)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Calls every actor; yields one Future per actor, in rank order."""
        yield from self._each(self._mesh._every, args, kwargs)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Monarch's: runs the endpoint on every proc of the active mesh, in order with
        its tensor ops, mesh tensors among the arguments given as each proc's shard,
        and keeps what each returns there: a mesh tensor (``monarch_kernel.tensor``)."""
        if not _rref:
            raise MeshTensorError(
                f"{self._what}.rref() makes a distributed tensor: call it under `with procs.activate():`"
            )
        return _rref[0](self, args, kwargs)

    def _each(self, local: Sequence[int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Future[R]]:
        """Calls the actors at ``local`` (indices into this mesh) in one native call;
        one Future each."""
        shape = self._mesh._shape
        if self._explicit:  # the i-th Future: the i-th answer to arrive, from any actor
            port, outs, fail = _port.stream_port(len(local))
            calls = self._send((port, *args), kwargs, local, False)
            _port.fail_on_error(calls, self._decoder(local), fail)
            return [Future(_calls=calls, _local=out) for out in outs]
        calls = self._send(args, kwargs, local, False)
        proc, what = self._mesh._proc, self._what
        return [
            Future(
                _calls=[c],
                _finish=_finish_one(proc, shape.ranks[i], Point(i, shape.extent), what),
                _where=(proc.name, what, (shape.ranks[i],)),
            )
            for i, c in zip(local, calls)
        ]

    def __repr__(self) -> str:
        return f"<Endpoint {self._what}>"


def _positional_range(sig: inspect.Signature) -> tuple[int, int]:
    """How many positional arguments (``self`` included) a call may pass with no keywords
    and be sure to bind; (1, 0), an empty range, when keyword-only parameters without
    defaults make every call go through ``bind``."""
    lo = hi = 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            hi += 1
            lo += p.default is p.empty
        elif p.kind is p.VAR_POSITIONAL:
            hi = 1 << 30
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            return 1, 0
    return max(lo - 1, 0), hi - 1


def _signature(prop: EndpointProperty[Any]) -> inspect.Signature:
    """The method's signature, read once per ``EndpointProperty`` and kept on it (not in
    a table by ``id``: a property made by ``as_endpoint`` is freed after its call, and a
    later one at the same address would find another method's signature)."""
    sig: inspect.Signature | None = prop.__dict__.get("_call_signature")
    if sig is None:
        sig = prop.__dict__["_call_signature"] = inspect.signature(prop._method)
    return sig


class ActorMesh(MeshTrait, Generic[R]):
    """Actors of one class, one per proc of a (sliced) proc mesh, under one name.

    Picklable: pass it to another actor's endpoint and that actor can call it.
    """

    def __init__(self, name: str, cls: type, proc: ProcRef, shape: Shape) -> None:
        self._name = name
        self._class = cls
        self._proc = proc
        self._shape = shape
        self._endpoints = endpoints_of(cls)
        self._labels = list(shape.labels)
        self._sizes = list(shape.extent.sizes)
        self._conn_cache: list[Any] | None = None
        self._conn_gen = -1
        #: The indices of all its ranks: one tuple, which every call to all of them
        #: passes, so that the fan-out converts it once.
        self._every = tuple(range(len(shape)))
        #: Its shape as its own (its ranks its indices): what its calls' values are over.
        self._local = Shape(shape.extent, self._every)
        self._endpoint_cache: dict[str, Endpoint[Any]] = {}
        #: By proc rank: the exceptions of constructors that raised (Monarch reports
        #: them to supervision, not at spawn); calls to those ranks raise them.
        self._init_errors: dict[int, ActorError] = {}

    def _conns(self) -> list[Any]:
        """Connections to this mesh's procs, in local rank order (opened once)."""
        gen = self._proc.state().gen
        if self._conn_cache is None or self._conn_gen != gen:
            self._conn_cache = self._proc.conns(list(self._shape.ranks))
            self._conn_gen = gen
        return self._conn_cache

    def _new_with_shape(self, shape: Shape) -> ActorMesh[R]:
        mesh: ActorMesh[R] = ActorMesh(self._name, self._class, self._proc, shape)
        mesh._init_errors = self._init_errors
        return mesh

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        ep = self._endpoint_cache.get(attr)
        if ep is not None:
            return ep
        prop = self._endpoints.get(attr)
        if prop is not None:
            ep = self._endpoint_cache[attr] = Endpoint(self, attr, prop)
            return ep
        if callable(getattr(self._class, attr, None)):
            return NotAnEndpoint(self, attr)
        if hasattr(self._class, attr):
            raise UnknownEndpointError(
                f"{self._class.__qualname__}.{attr} is not an endpoint; mark it with @endpoint to call it "
                "on the mesh"
            )
        names = ", ".join(sorted(self._endpoints)) or "none"
        raise UnknownEndpointError(
            f"actor mesh {self._name!r} ({self._class.__qualname__}) has no endpoint {attr!r}; its endpoints: {names}"
        )

    def stop(self) -> Future[None]:
        """Stops these actors (their ``__cleanup__`` runs); the procs stay."""
        ranks = list(self._shape.ranks)
        conns = self._proc.conns(ranks)
        name = self._name
        calls = self._proc.command_calls(
            _native.Endpoint.stopping(name), conns, ranks, lambda c: c.stop_actor(name)
        )
        session = session_for(self._proc)
        if session is not None:
            session.forget_actor(self._name, ranks)
        what, proc, shape = f"stop of {self._name}", self._proc, self._shape
        local = Shape(shape.extent)

        def finish(replies: list[Any]) -> None:
            decode_all(replies, proc, shape.ranks, local.point, what)

        return Future(_calls=calls, _finish=finish)

    @property
    def initialized(self) -> Future[None]:
        return Future._resolved(None)

    def __repr__(self) -> str:
        return f"ActorMesh(name={self._name!r}, class={self._class.__qualname__}, shape={self._shape.extent})"

    def __reduce__(self) -> Any:
        return (ActorMesh, (self._name, self._class, self._proc, self._shape))


class NotAnEndpoint:
    """A method of an actor mesh's class that is not marked ``@endpoint``: calling it
    on the mesh is an error, and ``as_endpoint(mesh.method)`` makes it an endpoint."""

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh = mesh
        self._name = name

    def _refuse(self) -> UnknownEndpointError:
        return UnknownEndpointError(
            f"{self._mesh._class.__qualname__}.{self._name} is not an endpoint; mark it with @endpoint to "
            f"call it on the mesh (or use as_endpoint(mesh.{self._name}))"
        )

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        raise self._refuse()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()


def check_endpoint_names(cls: type) -> None:
    clash = sorted(n for n in endpoints_of(cls) if hasattr(ActorMesh, n))
    if clash:
        raise MeshSpecError(
            f"ActorMesh has an attribute that collides with an endpoint name: {clash}; rename the endpoint"
        )


__all__ = ["ActorMesh", "Endpoint", "NotAnEndpoint", "check_endpoint_names", "decode_all", "decode_reply"]
