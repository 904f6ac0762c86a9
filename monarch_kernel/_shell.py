"""``shell`` (Monarch's ``monarch.job.shell``): an interactive shell on a host of a
mesh, from a terminal.

``shell(host_mesh)`` starts one proc on the host, whose ``_RemoteShell`` runs the
user's shell in a pseudo-terminal there (in a session of its own, the pty its
controlling terminal). Here, the terminal goes into raw mode (every key, ^C and ^D
included, goes to the remote shell, whose pty does what a terminal does with them)
and its bytes go back and forth as a stream over ports, with the flow control of
``_port_forward.StreamSender``: keys one way, the screen the other, plus the
terminal's size whenever it changes (``Resize``) and, at the end, the shell's exit
status (``Exit``). The terminal is restored however ``shell`` ends, the proc stopped.

It needs a terminal on stdin: elsewhere (a notebook, whose stdin is no terminal) it
raises ``MeshSpecError`` before starting anything, naming ``exec_command`` for
commands that need no terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import io
import os
import pwd
import select
import signal
import struct
import sys
import termios
import tty
from collections.abc import Iterator
from typing import Any, NamedTuple

from monarch_kernel._port_forward import CHUNK, Abort, Ack, Data, Eof, StreamSender
from monarch_kernel.actor import Actor, endpoint
from monarch_kernel.errors import MeshSpecError
from monarch_kernel.mesh import Channel, Port, PortReceiver

#: Keys typed ahead of the remote shell; the screen's bytes not yet shown.
KEYS_WINDOW = 64 * 1024
SCREEN_WINDOW = 1024 * 1024
#: How long a shell that was hung up on may take to end before it is killed.
HANGUP_GRACE_S = 1.0

#: Run by the remote proc's Python to start the shell: a session of its own whose
#: controlling terminal is the pty on its stdin, then the shell itself.
_LOGIN_TTY = "import os, sys; os.login_tty(0); os.execvp(sys.argv[1], sys.argv[1:])"


class Resize(NamedTuple):
    """The terminal's new size."""

    rows: int
    columns: int


class Exit(NamedTuple):
    """The shell ended, with this status (128 + N for signal N)."""

    status: int


# -- file descriptors on an event loop ---------------------------------------------------


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


async def _readable(fd: int, also: asyncio.Future[Any] | None = None) -> None:
    """Returns once ``fd`` can be read (or ``also`` is done)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, _wake, ready)
    try:
        await asyncio.wait([ready] if also is None else [ready, also], return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.remove_reader(fd)


async def _writable(fd: int) -> None:
    """Returns once ``fd`` can be written."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_writer(fd, _wake, ready)
    try:
        await ready
    finally:
        loop.remove_writer(fd)


async def _read(fd: int, also: asyncio.Future[Any] | None = None) -> bytes:
    """What can be read from ``fd`` once it is readable (it may block, as a
    terminal's stdin does: nothing is read before it is ready); b"" at its end (for
    a pty's master, EIO: every process has closed the terminal), or once ``also`` is
    done and nothing is left to read."""
    while True:
        await _readable(fd, also)
        try:
            return os.read(fd, CHUNK)
        except BlockingIOError:
            if also is not None and also.done():
                return b""
        except OSError as e:
            if e.errno == errno.EIO:
                return b""
            raise


async def _write(fd: int, data: bytes) -> None:
    """Writes all of ``data`` to ``fd``: at once where it blocks (a terminal), else
    as it becomes writable (a pty's master, non-blocking)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
            continue
        except BlockingIOError:
            pass
        await _writable(fd)


def _write_blocking(fd: int, data: bytes) -> None:
    """Writes all of ``data`` to ``fd``, waiting where it is non-blocking and full."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])


def _size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return size.lines, size.columns


def _set_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


# -- the remote side -------------------------------------------------------------------


def _status(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def _login_shell() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    except KeyError:
        return "/bin/sh"


class _RemoteShell(Actor):
    """The shell on its host, in a pty, relayed to and from ``shell``'s terminal."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._master: int | None = None
        #: The keys' receiver, kept to the end so that acknowledgements that come
        #: after the shell ended still find it.
        self._inbox: PortReceiver[Any] | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    @endpoint
    async def start(
        self,
        screen: Port[Any],
        env: dict[str, str] | None,
        workdir: str | None,
        client_cwd: str,
        term: str,
        size: tuple[int, int],
    ) -> Port[Any]:
        """Starts the shell; gives the port the keys go to."""
        if self._process is not None:
            raise RuntimeError("this remote shell has started already")
        child_env = {**os.environ, **(env or {}), "TERM": term}
        program = child_env.get("SHELL") or _login_shell()
        cwd = workdir or (client_cwd if os.path.isdir(client_cwd) else None)
        master, slave = os.openpty()
        try:
            _set_size(master, *size)
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                "-c",
                _LOGIN_TTY,
                program,
                "-i",
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=child_env,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self._master = master
        keys, self._inbox = Channel[Any].open()
        out = StreamSender(screen, SCREEN_WINDOW)
        exited = asyncio.ensure_future(self._process.wait())
        self._tasks = [
            exited,
            asyncio.create_task(self._screen(out, exited)),
            asyncio.create_task(self._keys(out, self._inbox)),
        ]
        return keys

    async def _screen(self, out: StreamSender, exited: asyncio.Future[int]) -> None:
        """The pty's output to the client until the shell has ended and nothing is
        left to read; then, once all of it is acknowledged, its exit status."""
        assert self._master is not None
        while data := await _read(self._master, exited):
            await out.data(data)
        status = _status(await exited)
        await out.drained()
        out.send(Exit(status))

    async def _keys(self, out: StreamSender, inbox: PortReceiver[Any]) -> None:
        """The client's messages: keys for the pty (typed by ``_type``, so that a shell
        that does not read them holds up no acknowledgement of the screen),
        acknowledgements of the screen, the terminal's size; its end (EOF, abort)
        hangs up on the shell."""
        assert self._master is not None
        typed: asyncio.Queue[bytes] = asyncio.Queue()  # at most the client's window of keys
        self._tasks.append(asyncio.create_task(self._type(out, typed)))
        while True:
            message = await inbox.recv()
            if isinstance(message, Data):
                typed.put_nowait(message.data)
            elif isinstance(message, Ack):
                out.acked(message.nbytes)
            elif isinstance(message, Resize):
                _set_size(self._master, message.rows, message.columns)
            elif isinstance(message, (Eof, Abort)):
                self._tasks.append(asyncio.create_task(self._hang_up()))

    async def _type(self, out: StreamSender, typed: asyncio.Queue[bytes]) -> None:
        """Writes the keys into the pty as the shell takes them, acknowledging each."""
        assert self._master is not None
        while True:
            data = await typed.get()
            with contextlib.suppress(OSError):  # (the shell has ended: the keys go nowhere)
                await _write(self._master, data)
            out.send(Ack(len(data)))

    async def _hang_up(self) -> None:
        """As a terminal that closes: SIGHUP to the shell and the job in the
        foreground; those still running after ``HANGUP_GRACE_S`` are killed."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        groups = {process.pid}
        if self._master is not None:
            with contextlib.suppress(OSError):
                groups.add(os.tcgetpgrp(self._master))
        groups.discard(os.getpgrp())
        _signal(groups, signal.SIGHUP)
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), HANGUP_GRACE_S)
        except TimeoutError:
            pass
        _signal(groups, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()

    async def __cleanup__(self, exc: Exception | None) -> None:
        await self._hang_up()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._master is not None:
            os.close(self._master)
            self._master = None


def _signal(groups: set[int], sig: signal.Signals) -> None:
    for group in groups:
        if group > 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)


# -- this side: the terminal -----------------------------------------------------------


def _terminal() -> tuple[int, int]:
    """The terminal's file descriptors to read keys from and write the screen to;
    raises ``MeshSpecError`` where stdin is no terminal."""
    try:
        keys = sys.stdin.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        keys = -1
    if keys < 0 or not os.isatty(keys):
        raise MeshSpecError(
            "shell() is interactive: it needs a terminal on stdin, and here stdin is none (a notebook, "
            "or input from a pipe). Run it in a script from a terminal (python -c 'from "
            "monarch_kernel.job import shell; ...'); to run a command on the host instead, use "
            "exec_command(host_mesh, [...]), whose output shows here"
        )
    try:
        screen = sys.stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        screen = keys  # the terminal itself
    return keys, screen


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The terminal in raw mode, restored however the block ends (keys typed ahead
    are kept)."""
    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSADRAIN)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _session(
    keys_fd: int, screen_fd: int, to_remote: Port[Any], inbox: PortReceiver[Any], signalled: list[int]
) -> int:
    """Relays the terminal until the remote shell ends; its exit status. SIGTERM or
    SIGHUP ends it (cancelled), noted in ``signalled``."""
    loop = asyncio.get_running_loop()
    out = StreamSender(to_remote, KEYS_WINDOW)

    async def keys() -> None:
        while data := await _read(keys_fd):
            await out.data(data)
        out.send(Eof())

    async def screen() -> int:
        while True:
            message = await inbox.recv()
            if isinstance(message, Data):
                _write_blocking(screen_fd, message.data)
                out.send(Ack(len(message.data)))
            elif isinstance(message, Ack):
                out.acked(message.nbytes)
            elif isinstance(message, Exit):
                return message.status
            elif isinstance(message, Abort):
                raise RuntimeError(f"the remote shell failed: {message.why}")

    main = asyncio.current_task()
    assert main is not None

    def ended_by(sig: int) -> None:
        signalled.append(sig)
        main.cancel()

    handled: dict[int, Any] = {}
    for sig, handler, args in (
        (signal.SIGWINCH, lambda: out.send(Resize(*_size(keys_fd))), ()),
        (signal.SIGTERM, ended_by, (signal.SIGTERM,)),
        (signal.SIGHUP, ended_by, (signal.SIGHUP,)),
    ):
        previous = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, handler, *args)
        except (RuntimeError, ValueError):  # not the main thread: no signals here
            continue
        handled[sig] = previous
    typing = asyncio.create_task(keys())
    showing = asyncio.create_task(screen())
    try:
        await asyncio.wait([typing, showing], return_when=asyncio.FIRST_COMPLETED)
        if typing.done():
            typing.result()  # raises what ended it; at EOF, the screen goes on to the end
        return await showing
    except BaseException:
        out.abort("the terminal's side ended")
        raise
    finally:
        for number, previous in handled.items():
            loop.remove_signal_handler(number)
            signal.signal(number, previous)
        for t in (typing, showing):
            t.cancel()
        await asyncio.gather(typing, showing, return_exceptions=True)


def shell(host_mesh_singleton: Any, *, env: dict[str, str] | None = None, workdir: str | None = None) -> int:
    """Runs the user's shell, interactively, on the one host of ``host_mesh_singleton``
    (``this_host()``, or one host of a job: ``hosts.slice(hosts=0)``), from the
    terminal this runs in; returns its exit status once it ends.

    Args:
        host_mesh_singleton: A host mesh of one host.
        env: Variables added to the shell's environment there.
        workdir: Where the shell starts; by default this process's working folder
            where that host has it.

    Raises:
        MeshSpecError: (a ValueError) the mesh has more than one host, or stdin is
            no terminal (a notebook): run it in a script from a terminal.
    """
    hosts = host_mesh_singleton.size()
    if hosts != 1:
        raise MeshSpecError(
            f"shell() needs a host mesh of one host, and this one has {hosts}: slice it to one, "
            "e.g. hosts.slice(hosts=0)"
        )
    keys_fd, screen_fd = _terminal()
    term = os.environ.get("TERM") or "xterm-256color"
    signalled: list[int] = []
    procs = host_mesh_singleton.spawn_procs(per_host={"procs": 1})
    try:
        remote = procs.spawn("shell", _RemoteShell)
        to_here, inbox = Channel[Any].open()
        to_remote = remote.start.call_one(to_here, env, workdir, os.getcwd(), term, _size(keys_fd)).get()
        sys.stdout.flush()
        with _raw(keys_fd):
            return asyncio.run(_session(keys_fd, screen_fd, to_remote, inbox, signalled))
    except asyncio.CancelledError:
        if not signalled:
            raise
    finally:
        procs.stop()
    # Ended by SIGTERM or SIGHUP: now that all is put back, the signal as if it came
    # now (its usual handler; by default, the end of this process).
    signal.raise_signal(signalled[0])
    return 128 + signalled[0]


__all__ = ["shell"]
