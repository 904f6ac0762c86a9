"""Ports and channels, as Monarch has them: ``Channel.open()`` gives a ``Port`` (send
end: picklable, usable from any thread, actor or process) and a ``PortReceiver``
(receive end, in the process that opened it).

A port is an address: the receiving process's worker server (a worker's own; in a
controller the one ``this_proc()`` starts, on first use), its token, and a number.
A message on a port is a message of its own kind (``_native.KIND_PORT``: a ``Call``
with a ``PortMessage``, worker.proto) whose typed fields say which port, the
sender's rank and whether it is an exception, and whose payload is the value alone.
It takes the native path of any call (on the sender's connection, in order with its
calls; its large buffers through the transfer engine). The receiving dispatcher
unpickles it on arrival and puts it in the port's inbox, in arrival order.

PORT-1: messages sent on one port from one thread arrive in the order sent.
PORT-2: a message for a port whose receiver is gone is refused, and the sender's
process says so on stderr; it is never silently dropped. A once port sends one message.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from monarch_kernel import _native, _origin
from monarch_kernel.mesh import _buffers
from monarch_kernel.mesh._future import Future
from monarch_kernel.mesh._role import here
from monarch_kernel.mesh._serial import dumps, exception_blob, loads, rebuild_exception

R = TypeVar("R")

#: Longest a send waits for its receiver to pull its large buffers (XFER-2).
SEND_WAIT_S = 60.0

# -- this process's receiving end -------------------------------------------------------


def local_address() -> tuple[str, str]:
    """This process's worker server, where its ports receive: started on first use in
    a controller (``this_proc()``, through its role)."""
    if here.server is None and here.controller is not None:
        here.controller.start_server()
    if here.server is None:
        raise RuntimeError(
            "this process has no worker server to receive port messages on; call "
            "monarch_kernel.this_proc() first"
        )
    return here.server


class _Inbox:
    """A port's messages not yet received, and the receivers waiting for one."""

    def __init__(self, once: bool) -> None:
        self.lock = threading.Lock()
        self.items: collections.deque[tuple[int | None, bool, Any]] = collections.deque()
        self.waiters: collections.deque[concurrent.futures.Future[Any]] = collections.deque()
        self.once = once
        self.received = 0
        #: Called with each message instead of queueing it (a call's own port).
        self.sink: Callable[[tuple[int | None, bool, Any]], None] | None = None

    def put(self, item: tuple[int | None, bool, Any]) -> None:
        with self.lock:
            self.received += 1
            sink = self.sink
            waiter = None
            if sink is None:
                while self.waiters and waiter is None:
                    w = self.waiters.popleft()
                    if w.set_running_or_notify_cancel():
                        waiter = w
                if waiter is None:
                    self.items.append(item)
        if sink is not None:
            sink(item)
        elif waiter is not None:
            waiter.set_result(item)

    def get(self) -> concurrent.futures.Future[Any]:
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self.lock:
            if self.items:
                f.set_result(self.items.popleft())
            else:
                self.waiters.append(f)
        return f


#: Open ports' inboxes; one lives while its receivers (or its call's Future) do.
_inboxes: weakref.WeakValueDictionary[int, _Inbox] = weakref.WeakValueDictionary()
_ids = itertools.count(1)


#: Ports of calls (explicit-response endpoints), most recent last: a message that
#: comes after the call's answer is dropped without a word (a stream takes the
#: first n; the caller may have stopped waiting).
_answered: dict[int, None] = {}
_ANSWERED_KEEP = 10_000


def _call_port_opened(pid: int) -> None:
    _answered[pid] = None
    while len(_answered) > _ANSWERED_KEEP:
        del _answered[next(iter(_answered))]


def _open(once: bool) -> tuple[int, _Inbox]:
    inbox = _Inbox(once)
    pid = next(_ids)
    _inboxes[pid] = inbox
    return pid, inbox


def deliver(item: Any, token: str) -> str | None:
    """A message for one of this process's ports (``KIND_PORT``, called by the
    dispatcher, on its routing thread); returns why it was refused, or None."""
    pid = item.port
    inbox = _inboxes.get(pid)
    if inbox is None and pid in _answered:  # a call's port, answered: the rest is not awaited
        return None
    if inbox is None or (inbox.once and inbox.received):
        return f"port {pid} is closed: its receiver is gone, or it was a once port and has had its message"
    rank, is_exc = item.sender_rank, item.is_exception
    try:
        value = loads(item.payload, item.buffers, token)
        if is_exc:
            value = rebuild_exception(*value)
    except Exception as e:  # the receiver sees it where it waits
        is_exc, value = True, e
    inbox.put((rank, is_exc, value))
    if inbox.once:
        _inboxes.pop(pid, None)
    return None


# -- the sending end --------------------------------------------------------------------

_conns: dict[tuple[str, str], Any] = {}


def _conn(addr: str, token: str) -> Any:
    c = _conns.get((addr, token))
    if c is None or c.lost() is not None:
        c = _conns[(addr, token)] = _native.WorkerConn(addr, token)
    return c


def _refused(pid: int, call: Any) -> None:
    """PORT-2: says on stderr why a port message did not arrive (runs when its ack does)."""
    try:
        reply = call.wait(0)
    except BaseException as e:
        print(f"monarch: a message on port {pid} was not delivered: {e}", file=sys.stderr, flush=True)
        return
    if reply.kind != _native.REPLY_RESULT:
        why = bytes(reply.payload).decode("utf-8", "replace")
        print(f"monarch: a message on port {pid} was refused: {why}", file=sys.stderr, flush=True)


class Port(Generic[R]):
    """The sending end of a channel: ``send(value)``, ``exception(exc)``. Picklable:
    pass it to any actor on any proc, which may send on it from any thread."""

    def __init__(
        self, addr: str, token: str, port_id: int, once: bool = False, rank: int | None = None
    ) -> None:
        self._addr = addr
        self._token = token
        self._id = port_id
        self._once = once
        self._rank = rank
        self._used = False
        self._lock = threading.Lock()  # PORT-1: one send at a time from this object

    def send(self, obj: R) -> None:
        """Sends ``obj`` to the receiver, without waiting for it to arrive."""
        self._post(False, obj)

    def exception(self, obj: BaseException) -> None:
        """Sends an exception: the receiver's ``recv()`` raises it."""
        self._post(True, exception_blob(obj))

    def _post(self, is_exc: bool, value: Any) -> None:
        with self._lock:
            if self._once and self._used:
                raise ValueError(f"port {self._id} is a once port and has sent its one message")
            self._used = True
            regs: list[int] = []
            live: list[int] = []
            payload, buffers = dumps(value, f"message on port {self._id}", self._token, 1, regs, live)
            try:
                calls = [
                    _conn(self._addr, self._token).send_port(
                        self._id, self._rank, is_exc, payload, buffers, origin=_origin.current()
                    )
                ]
            except BaseException:
                _buffers.drop_now(regs)
                raise
            _buffers.drop_when_done(calls, regs)
            pid = self._id
            calls[0].add_done_callback(lambda: _refused(pid, calls[0]))
            if live:  # XFER-2, as for a broadcast
                _buffers.wait_read(live, calls, SEND_WAIT_S)

    def __reduce__(self) -> Any:
        return (
            _port_here,
            (self._addr, self._token, self._id, self._once, self._rank, _native.mesh_ca(self._token)),
        )

    def __repr__(self) -> str:
        return f"<Port {self._id} at {self._addr}{' once' if self._once else ''}>"


def _port_here(
    addr: str, token: str, port_id: int, once: bool, rank: int | None, ca: str | None
) -> Port[Any]:
    """A port unpickled: it keeps the rank it had, or takes the rank of the message
    that brought it here (each actor of a ``call`` answers as its own rank)."""
    if ca and _native.mesh_ca(token) is None:
        _native.set_mesh_ca(token, ca)
    if rank is None:
        from monarch_kernel.actor import _current

        ctx = _current.get()
        if ctx.actor_instance.name != "root":
            rank = ctx.message_rank.rank
    return Port(addr, token, port_id, once, rank)


class DroppingPort(Port[Any]):
    """The port an explicit-response endpoint gets when nobody waits for its answer
    (``broadcast``): what it sends goes nowhere; an exception is printed."""

    def __init__(self) -> None:
        super().__init__("", "", 0)

    def _post(self, is_exc: bool, value: Any) -> None:
        if is_exc:
            print(f"monarch: an exception sent on a dropping port: {value[0]}", file=sys.stderr, flush=True)

    def __reduce__(self) -> Any:
        return (DroppingPort, ())


class PortReceiver(Generic[R]):
    """The receiving end of a channel: ``recv()`` gives a Future of the next message."""

    def __init__(self, port_id: int, inbox: _Inbox) -> None:
        self._id = port_id
        self._inbox = inbox

    def recv(self) -> Future[R]:
        """The next message, in arrival order (PORT-1), as a Future; an exception sent
        with ``port.exception(e)`` is raised by its ``get()``."""
        return Future(_local=_map(self._inbox.get(), self._process))

    def _process(self, item: tuple[int | None, bool, Any]) -> Any:
        return value_of(item)

    def ranked(self) -> RankedPortReceiver[R]:
        """The same receiver, whose messages come with the rank that sent them."""
        r: RankedPortReceiver[R] = RankedPortReceiver.__new__(RankedPortReceiver)
        r._id, r._inbox = self._id, self._inbox
        return r

    def __repr__(self) -> str:
        return f"<PortReceiver {self._id}>"


class RankedPortReceiver(PortReceiver[R]):
    """A receiver whose ``recv()`` gives ``(rank, value)``."""

    def _process(self, item: tuple[int | None, bool, Any]) -> Any:
        rank = item[0]
        value = super()._process(item)
        if rank is None:
            raise ValueError(
                "a ranked receiver got a message without a rank: it was sent from outside an actor's "
                "message, by a port that was never passed to an actor"
            )
        return rank, value


def _map(f: concurrent.futures.Future[Any], fn: Callable[[Any], Any]) -> concurrent.futures.Future[Any]:
    out: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def done(src: concurrent.futures.Future[Any]) -> None:
        try:
            out.set_result(fn(src.result()))
        except BaseException as e:
            out.set_exception(e)

    f.add_done_callback(done)
    return out


class Channel(Generic[R]):
    """Opens ports: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        """A new port and its receiver, in this process; ``once=True``: a port for one message."""
        addr, token = local_address()
        pid, inbox = _open(once)
        return Port(addr, token, pid, once), PortReceiver(pid, inbox)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], RankedPortReceiver[R]]:
        """As ``open``, with a receiver that gives ``(rank, value)``."""
        port: Port[R]
        receiver: PortReceiver[R]
        port, receiver = Channel.open(once)
        return port, receiver.ranked()


# -- a call's own port (explicit_response_port endpoints) ------------------------------


def call_port(
    expected: int, finish: Callable[[list[tuple[int | None, bool, Any]]], Any]
) -> tuple[Port[Any], concurrent.futures.Future[Any], Callable[[BaseException], None]]:
    """A port for one call of an explicit-response endpoint: ``finish`` turns the
    first ``expected`` messages into the call's value. Returns the port, the future
    of the value, and ``fail(exc)``: the call failed before its answer came (its
    worker died, its endpoint raised)."""
    addr, token = local_address()
    pid, inbox = _open(False)
    _call_port_opened(pid)
    out: concurrent.futures.Future[Any] = concurrent.futures.Future()
    got: list[tuple[int | None, bool, Any]] = []
    lock = threading.Lock()

    def sink(item: tuple[int | None, bool, Any]) -> None:
        with lock:
            if out.done():
                return
            got.append(item)
            if len(got) < expected:
                return
        _inboxes.pop(pid, None)
        _settle(out, lambda: finish(got))

    inbox.sink = sink
    out.inbox = inbox  # type: ignore[attr-defined]  # the port lives while its answer is awaited

    def fail(exc: BaseException) -> None:
        _inboxes.pop(pid, None)
        _set(out, exc=exc)

    return Port(addr, token, pid), out, fail


def value_of(item: tuple[int | None, bool, Any]) -> Any:
    """A port message ``(rank, is_exception, value)`` as what its receiver gets: the
    value, or the exception sent (raised)."""
    _rank, is_exc, value = item
    if is_exc:
        raise value
    return value


def _settle(f: concurrent.futures.Future[Any], compute: Callable[[], Any]) -> None:
    """Settles ``f`` with what ``compute()`` gives, or the exception it raises."""
    try:
        value = compute()
    except BaseException as e:
        _set(f, exc=e)
        return
    _set(f, value=value)


def _set(f: concurrent.futures.Future[Any], value: Any = None, exc: BaseException | None = None) -> None:
    try:
        if exc is not None:
            f.set_exception(exc)
        else:
            f.set_result(value)
    except concurrent.futures.InvalidStateError:  # already settled
        pass


def stream_port(
    n: int,
) -> tuple[Port[Any], list[concurrent.futures.Future[Any]], Callable[[BaseException], None]]:
    """A port for a ``stream`` of an explicit-response endpoint: ``n`` futures, the
    i-th settled by the i-th message to arrive (from whichever actor); ``fail(exc)``
    settles those still open."""
    addr, token = local_address()
    pid, inbox = _open(False)
    _call_port_opened(pid)
    outs: list[concurrent.futures.Future[Any]] = [concurrent.futures.Future() for _ in range(n)]
    count = [0]
    lock = threading.Lock()

    def sink(item: tuple[int | None, bool, Any]) -> None:
        with lock:
            i = count[0]
            count[0] += 1
        if i >= n:
            return
        if i == n - 1:
            _inboxes.pop(pid, None)
        _settle(outs[i], lambda: value_of(item))

    inbox.sink = sink
    for f in outs:
        f.inbox = inbox  # type: ignore[attr-defined]

    def fail(exc: BaseException) -> None:
        _inboxes.pop(pid, None)
        for f in outs:
            _set(f, exc=exc)

    return Port(addr, token, pid), outs, fail


def fail_on_error(
    calls: Sequence[Any], decode: Callable[[Any, int], None], fail: Callable[[BaseException], None]
) -> None:
    """Watches the calls behind a port's answer: one that fails (its worker died, its
    endpoint raised) settles the answer with that error. ``decode(reply_or_exc, i)``
    raises what reply ``i`` means."""

    def check(i: int, call: Any) -> None:
        try:
            reply = call.wait(0)
            if reply.kind == _native.REPLY_RESULT:
                return
        except BaseException as e:  # decoded on a thread of its own: it may ask the agent
            reply = e
        threading.Thread(target=_decode_failure, args=(decode, reply, i, fail), daemon=True).start()

    for i, c in enumerate(calls):
        c.add_done_callback(lambda i=i, c=c: check(i, c))


def _decode_failure(
    decode: Callable[[Any, int], None], reply: Any, i: int, fail: Callable[[BaseException], None]
) -> None:
    try:
        decode(reply, i)
    except BaseException as e:
        fail(e)
    else:
        fail(RuntimeError("the call failed"))


__all__ = [
    "Channel",
    "DroppingPort",
    "Port",
    "PortReceiver",
    "RankedPortReceiver",
    "call_port",
    "deliver",
    "fail_on_error",
    "stream_port",
    "value_of",
]
