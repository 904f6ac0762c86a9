"""``PortForwarder`` (Monarch's ``monarch.job.PortForwarder``): a TCP port of each
proc of one mesh, reachable on the proc at the same coordinates of another, and the
byte stream over ports that carries each connection (``shell`` uses it too,
``_shell.py``).

A forward is two actor meshes that the ``PortForwarder`` spawns, and so owns (OWN-1):
a ``_Source`` on each proc of the source mesh listens on its address; each connection
it accepts asks the ``_Destination`` at the same coordinates to connect to
``127.0.0.1:dst_port`` on its proc, and from then on the two ends relay the
connection's bytes to each other, each end sending on a port of the other's
(``Channel``). Stopping the ``PortForwarder`` stops them: listeners first, then
every connection.

The stream (``StreamSender`` and the messages ``Data``, ``Ack``, ``Eof``,
``Abort``): an end sends a chunk only while the other end holds less than a window
of bytes it has not written out yet, and acknowledges each chunk once written, so a
slow reader slows the writer down instead of filling memory on the way. An end
that reads EOF sends ``Eof`` and the other end shuts its socket's writing side
(a half-close, in each direction on its own); an error or a stop sends ``Abort``,
and the other end resets its socket. Chunks stay below the size that goes through
the transfer engine, so each is sent inline, in order on its port (PORT-1), without
the event loop waiting for the receiver to pull it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from monarch_kernel.actor import Actor, current_rank, endpoint
from monarch_kernel.errors import ActorError, SupervisionError
from monarch_kernel.mesh import ActorMesh, Channel, Point, Port, PortReceiver, ProcMesh

#: Where each destination connects: the service on the destination's own proc.
_DESTINATION_HOST = "127.0.0.1"
#: Bytes read at a time: below the 64 KiB from which bytes go through the transfer
#: engine (which makes a send wait until the receiver has pulled them).
CHUNK = 32 * 1024
#: Bytes an end may have sent that the other end has not written out yet.
WINDOW = 1024 * 1024

DstPort = int | Callable[[Point], int]
SrcAddress = str | Callable[[Point], str]


# -- the stream's messages -------------------------------------------------------------


class Data(NamedTuple):
    """Bytes for the other end to write out."""

    data: bytes


class Ack(NamedTuple):
    """The other end has written out this many more of the bytes sent to it."""

    nbytes: int


class Eof(NamedTuple):
    """No more data from this end (its reader saw EOF)."""


class Abort(NamedTuple):
    """This end failed or was stopped: the other end resets its connection."""

    why: str


class Aborted(Exception):
    """The other end sent ``Abort``."""


class StreamSender:
    """The sending half of one end of a stream: ``data`` waits while the other end
    holds ``window`` bytes it has not acknowledged."""

    def __init__(self, port: Port[Any], window: int = WINDOW) -> None:
        self._port = port
        self._window = window
        self._unacked = 0
        #: Set whenever an acknowledgement comes, for the waits on the window.
        self._acked = asyncio.Event()

    async def data(self, data: bytes) -> None:
        """Sends ``data`` once the window has room for it (a chunk larger than the
        window goes alone)."""
        while self._unacked and self._unacked + len(data) > self._window:
            self._acked.clear()
            await self._acked.wait()
        self._unacked += len(data)
        self._port.send(Data(data))

    def acked(self, nbytes: int) -> None:
        self._unacked -= nbytes
        self._acked.set()

    async def drained(self) -> None:
        """Returns once the other end has acknowledged every byte sent."""
        while self._unacked:
            self._acked.clear()
            await self._acked.wait()

    def send(self, message: Any) -> None:
        """Sends a message that is not data (it takes no room in the window)."""
        self._port.send(message)

    def abort(self, why: str) -> None:
        """Tells the other end to reset its connection; best effort (it may be gone)."""
        try:
            self._port.send(Abort(why))
        except Exception:
            pass


async def relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    out: StreamSender,
    inbox: PortReceiver[Any],
) -> None:
    """Relays one TCP connection (``reader``/``writer``) with the other end of its
    stream (``out`` to it, ``inbox`` from it) until both directions have ended:
    each has seen EOF and every byte sent is acknowledged. An error resets the
    connection and aborts the other end; being cancelled does too."""
    incoming: asyncio.Queue[bytes | None] = asyncio.Queue()  # at most a window of bytes

    async def upstream() -> None:  # this socket -> the other end
        while data := await reader.read(CHUNK):
            await out.data(data)
        out.send(Eof())
        await out.drained()

    async def receive() -> None:  # the other end -> here; runs until cancelled
        while True:
            message = await inbox.recv()
            if isinstance(message, Data):
                incoming.put_nowait(message.data)
            elif isinstance(message, Ack):
                out.acked(message.nbytes)
            elif isinstance(message, Eof):
                incoming.put_nowait(None)
            elif isinstance(message, Abort):
                raise Aborted(message.why)
            else:
                raise RuntimeError(f"a port forward got a message it does not know: {message!r}")

    async def downstream() -> None:  # -> this socket, acknowledged once written
        while (data := await incoming.get()) is not None:
            writer.write(data)
            await writer.drain()
            out.send(Ack(len(data)))
        if writer.can_write_eof():
            writer.write_eof()
        else:
            writer.close()

    up = asyncio.create_task(upstream())
    down = asyncio.create_task(downstream())
    rx = asyncio.create_task(receive())
    tasks = (up, down, rx)
    try:
        while not (up.done() and down.done()):
            await asyncio.wait([t for t in tasks if not t.done()], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t.done():
                    t.result()  # raises what ended it early
    except Aborted:
        writer.transport.abort()
    except asyncio.CancelledError:
        out.abort("the port forward was stopped")
        writer.transport.abort()
        raise
    except Exception as e:  # this socket failed (reset, refused write), or sending did
        out.abort(f"{type(e).__name__}: {e}")
        writer.transport.abort()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writer.close()


class _Connections:
    """The relays an actor runs, so that its ``__cleanup__`` ends them."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def add(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- the actors ------------------------------------------------------------------------


class _Destination(Actor):
    """One proc's end of a forward: connects to the service on this proc."""

    def __init__(self) -> None:
        self._port: int | None = None
        self._connections = _Connections()

    @endpoint
    async def configure(self, dst_port: DstPort) -> None:
        self._port = _port_of("dst_port", dst_port(current_rank()) if callable(dst_port) else dst_port)

    @endpoint
    async def open(self, to_source: Port[Any]) -> Port[Any]:
        """Connects to the service, and gives the port the source sends its bytes on."""
        if self._port is None:
            raise RuntimeError("this port forward destination has no port yet (configure)")
        reader, writer = await asyncio.open_connection(_DESTINATION_HOST, self._port)
        to_here, inbox = Channel[Any].open()
        self._connections.add(asyncio.create_task(relay(reader, writer, StreamSender(to_source), inbox)))
        return to_here

    async def __cleanup__(self, exc: Exception | None) -> None:
        await self._connections.close()


class _Source(Actor):
    """One proc's end of a forward: listens, and forwards each connection."""

    def __init__(self) -> None:
        self._destination: Any = None
        self._server: asyncio.AbstractServer | None = None
        self._connections = _Connections()
        self._what = ""

    @endpoint
    async def start(self, destination: ActorMesh[Any], src_address: SrcAddress, pointwise: bool) -> str:
        """Listens on this proc's address; forwards to the destination at the same
        coordinates (``pointwise``), else to the one destination. Gives the address
        it listens on."""
        point = current_rank()
        host, port = _parse_address(src_address(point) if callable(src_address) else src_address)
        self._destination = destination.slice(**dict(point)) if pointwise else destination
        self._server = await asyncio.start_server(self._accept, host, port)
        bound = _format_address(self._server.sockets[0].getsockname())
        self._what = f"port forward from {bound}"
        return bound

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection, on a task of asyncio's own (which treats its cancelling as
        an error: a stop ends it by returning)."""
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        to_here, inbox = Channel[Any].open()
        try:
            to_destination = await self._destination.open.call_one(to_here)
        except asyncio.CancelledError:
            writer.transport.abort()
            return
        except Exception as e:
            print(f"monarch: {self._what}: {_why(e)}; the connection is closed", file=sys.stderr)
            writer.transport.abort()
            return
        try:
            await relay(reader, writer, StreamSender(to_destination), inbox)
        except asyncio.CancelledError:
            return  # stopped: the relay has reset the connection and told the other end

    async def __cleanup__(self, exc: Exception | None) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._connections.close()
        if server is not None:
            await server.wait_closed()


class PortForwarder(Actor):
    """Owns port forwards between proc meshes: spawn one (on ``this_proc()``, say),
    call ``forward`` for each, and stop it to close every forward it started.

    For a server on rank 0 of ``procs`` (TensorBoard on 6006), reached at
    ``localhost:6006`` where the notebook runs::

        fwd = this_proc().spawn("fwd", PortForwarder)
        fwd.forward.call_one(procs.slice(procs=0), 6006, this_proc(), "127.0.0.1:6006").get()
    """

    def __init__(self) -> None:
        #: The (source, destination) actor meshes of each forward, stopped at the end.
        self._forwards: list[tuple[ActorMesh[Any], ActorMesh[Any]]] = []

    @endpoint
    async def forward(
        self,
        dst_proc_mesh: ProcMesh,
        dst_port: int | Callable[[Point], int],
        src_proc_mesh: ProcMesh,
        src_address: str | Callable[[Point], str],
    ) -> list[str]:
        """Starts forwarding: each proc of ``src_proc_mesh`` listens on
        ``src_address`` (``"address:port"``; port 0 takes a free one), and relays each
        connection to ``127.0.0.1:dst_port`` on the proc of ``dst_proc_mesh`` at the
        same coordinates. ``dst_port`` and ``src_address`` may be functions of the
        proc's ``Point``.

        The meshes must have the same extent, or both be one proc (``this_proc()``
        and ``procs.slice(procs=0)`` are both of extent ``{}``; a one-proc mesh of any
        extent pairs with any other). Gives the address each source proc listens
        on, in rank order.

        Raises:
            ValueError: the meshes differ in extent, or a port or address is not
                one (the caller sees it inside an ``ActorError``, as in Monarch).
        """
        pointwise = _pairing(dst_proc_mesh, src_proc_mesh)
        if not callable(dst_port):
            _port_of("dst_port", dst_port)
        if not callable(src_address):
            _parse_address(src_address)
        made: list[ActorMesh[Any]] = []
        try:
            # spawn waits for the constructors, which may need this very event loop
            # (a source on this_proc()): off the loop.
            source = await asyncio.to_thread(src_proc_mesh.spawn, "port_forward_source", _Source)
            made.append(source)
            destination = await asyncio.to_thread(
                dst_proc_mesh.spawn, "port_forward_destination", _Destination
            )
            made.append(destination)
            await destination.configure.call(dst_port)
            bound = await source.start.call(destination, src_address, pointwise)
        except BaseException:
            await _stop(made)
            raise
        self._forwards.append((source, destination))
        return list(bound.values())

    async def __cleanup__(self, exc: Exception | None) -> None:
        forwards, self._forwards = self._forwards, []
        await _stop([s for s, _ in forwards])  # no new connections, then none left
        await _stop([d for _, d in forwards])


async def _stop(meshes: list[ActorMesh[Any]]) -> None:
    async def one(mesh: ActorMesh[Any]) -> None:
        try:
            await mesh.stop()
        except SupervisionError:
            pass  # gone already: its procs stopped or died
        except Exception as e:
            print(f"monarch: stopping {mesh!r} of a port forward failed: {e}", file=sys.stderr)

    await asyncio.gather(*(one(m) for m in meshes))


def _why(e: Exception) -> str:
    """Why a destination did not open, in one line (not the remote traceback)."""
    if isinstance(e, ActorError) and e.exception is not None:
        where = f" (rank {e.rank})" if e.rank is not None else ""
        return f"the destination{where} could not connect: {type(e.exception).__name__}: {e.exception}"
    return f"the destination could not be reached: {type(e).__name__}: {e}"


# -- arguments -------------------------------------------------------------------------


def _pairing(dst: ProcMesh, src: ProcMesh) -> bool:
    """Whether each source proc forwards to the destination proc at its coordinates
    (same extents: True) or both meshes are one proc of different extents (False)."""
    if dst.extent == src.extent:
        return True
    if len(dst) == 1 and len(src) == 1:
        return False
    raise ValueError(
        f"PortForwarder.forward: the destination mesh has extent {dst.extent} and the source mesh "
        f"{src.extent}; they must be the same (each source proc forwards to the destination proc at "
        "its coordinates), or both one proc (slice both to one: procs.slice(procs=0))"
    )


def _port_of(what: str, port: Any, *, zero: bool = False) -> int:
    low = 0 if zero else 1
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= 65535:
        raise ValueError(f"{what} must be a TCP port, an int from {low} to 65535, not {port!r}")
    return port


def _parse_address(address: Any) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` as (host, port); port 0: any free one."""
    if not isinstance(address, str):
        raise ValueError(f"src_address must be 'address:port', not {address!r}")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"src_address must be 'address:port' (e.g. '127.0.0.1:6006'), not {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"src_address {address!r}: the port must be a number") from None
    return host, _port_of(f"src_address {address!r}: the port", number, zero=True)


def _format_address(sockname: Any) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


__all__ = ["PortForwarder"]
