"""Every exception monarch-kernel raises, in one hierarchy.

::

    MonarchKernelError
    ├── ActorError                 an endpoint raised; carries the remote traceback and rank
    ├── SupervisionError           a worker or actor failed (also a RuntimeError, as in Monarch)
    │   ├── MeshStoppedError       the mesh or actor mesh was stopped
    │   ├── MeshOwnershipError     another controller attached to the mesh since (fencing)
    │   └── AgentUnresponsiveError a mesh's host agent runs but does not answer
    │       └── MeshUnreachableError   its agents cannot be reached from here (another host)
    ├── MessageTooLargeError       a message is above the control plane's limit (also ValueError)
    ├── SerializationError         arguments or results cannot be pickled (also TypeError)
    ├── MeshAuthError              a peer rejected the mesh token
    │   └── MeshTLSError           a TLS handshake with a mesh's server failed (across hosts)
    ├── MeshSpecError              bad arguments to spawn_procs, spawn, logs (also ValueError)
    ├── MeshStartError             a mesh's host agents could not be started (also RuntimeError)
    ├── MeshNotFoundError          no running mesh of that name (also LookupError)
    ├── MeshStateError             the state folder cannot be written (also OSError)
    ├── DistributedSetupError      torch.distributed could not be set up (also RuntimeError)
    ├── RemoteException            a mesh tensor's op failed on a proc (the tensor engine)
    ├── MeshTensorError            a mesh tensor used where it cannot be (also ValueError)
    ├── UnknownEndpointError       no such endpoint on the actor (also AttributeError)
    ├── DimensionError             slicing names a dimension the mesh lacks (also TypeError)
    ├── MeshIndexError             slicing with an index out of range (also IndexError)
    └── NativeError                the native core failed (raised by ``_native``)
        ├── ConnectionLost         the peer process went away before replying
        └── TransferError          a data-plane transfer failed

The native core raises these classes itself (``native/src/py/errors.rs`` is the one
mapping of its errors), ``MeshAuthError`` for a rejected token, ``MeshTLSError`` for a
failed TLS handshake and ``MessageTooLargeError`` for a message above the control
plane's limit included.

The second base classes keep Monarch's exception types, so code that catches
``ValueError`` or ``IndexError`` around Monarch calls keeps working. Every message
names the thing (mesh, actor, rank, pid) and what to do next.
"""

from __future__ import annotations

import os
import re
import traceback
from typing import Any

__all__ = [
    "ActorError",
    "AgentUnresponsiveError",
    "ConnectionLost",
    "DimensionError",
    "DistributedSetupError",
    "MeshAuthError",
    "MeshIndexError",
    "MeshNotFoundError",
    "MeshOwnershipError",
    "MeshSpecError",
    "MeshStartError",
    "MeshStateError",
    "MeshStoppedError",
    "MeshTLSError",
    "MeshTensorError",
    "MeshUnreachableError",
    "RemoteException",
    "MessageTooLargeError",
    "MonarchKernelError",
    "NativeError",
    "SerializationError",
    "SupervisionError",
    "TransferError",
    "UnknownEndpointError",
]


#: monarch-kernel's own code: its frames are left out of tracebacks a notebook shows.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: Set to 1 (``%env MONARCH_FULL_TRACEBACK=1``) to see every frame, and the chain.
FULL_TRACEBACK_ENV = "MONARCH_FULL_TRACEBACK"


class MonarchKernelError(Exception):
    """Base of every monarch-kernel error."""

    def _render_traceback_(self) -> list[str]:
        """How IPython shows it: the user's own frames and the message, not the
        frames of monarch's call machinery (they say nothing the message does not);
        ``MONARCH_FULL_TRACEBACK=1`` shows everything, chained exceptions included."""
        if os.environ.get(FULL_TRACEBACK_ENV) == "1":
            return "".join(traceback.format_exception(self)).rstrip("\n").splitlines()
        frames = [
            f
            for f in traceback.extract_tb(self.__traceback__)
            if not f.filename.startswith(_PACKAGE_DIR) and f"{os.sep}IPython{os.sep}" not in f.filename
        ]
        lines = ["Traceback (most recent call last):"] if frames else []
        lines += "".join(traceback.format_list(frames)).rstrip("\n").splitlines()
        lines.append(f"{type(self).__name__}: {self}")
        lines.append(f"(monarch's own frames are not shown; %env {FULL_TRACEBACK_ENV}=1 shows them)")
        return lines


#: A ``%%mesh`` cell's file in a remote traceback (``kernel/_cells.py`` names them).
_CELL_FILE = re.compile(r'File "<%%mesh cell (\d+)>", line (\d+)')


class ActorError(MonarchKernelError):
    """An endpoint raised an exception; the actor is still usable.

    Attributes:
        exception: The remote exception, when it could be unpickled here, else None.
        exception_formatted: The remote traceback, notebook source lines included.
        message: What failed ("Actor call counter.incr failed.").
        rank: Where the actor that raised runs, as a Point of its proc mesh ({'procs': 2/4}).
    """

    def __init__(
        self,
        exception: BaseException | None,
        message: str = "A remote actor call has failed.",
        exception_formatted: str = "",
        rank: Any = None,
    ) -> None:
        self.exception = exception
        self.message = message
        self.exception_formatted = _CELL_FILE.sub(
            r"Cell In[\1], line \2",  # TB-1: %%mesh cells named as IPython names cells
            exception_formatted.replace(
                "Traceback (most recent call last):",
                "Traceback of where the remote call failed (most recent call last):",
            ),
        )
        self.rank = rank
        super().__init__(message)

    def __str__(self) -> str:
        where = f" (rank {self.rank})" if self.rank is not None else ""
        return f"{self.message}{where}\n {self.exception_formatted}"

    def __reduce__(self) -> Any:
        return (ActorError, (self.exception, self.message, self.exception_formatted, self.rank))

    def _render_traceback_(self) -> list[str]:
        """How IPython shows it: the remote traceback, not the local frames of the
        call machinery."""
        where = f" (rank {self.rank})" if self.rank is not None else ""
        return [*self.exception_formatted.rstrip("\n").splitlines(), f"ActorError: {self.message}{where}"]


class SupervisionError(MonarchKernelError, RuntimeError):
    """A worker process or an actor failed: the call cannot complete.

    Attributes mirror what is known: ``mesh``, ``rank``, ``host``, ``pid``,
    ``exit_code``, ``signal`` and ``log_tail`` (the worker's last output lines).
    """

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.mesh = details.get("mesh")
        self.rank = details.get("rank")
        self.host = details.get("host")
        self.pid = details.get("pid")
        self.exit_code = details.get("exit_code")
        self.signal = details.get("signal")
        self.log_tail: list[str] = details.get("log_tail") or []
        self.endpoint: str | None = details.get("endpoint")


class MeshStoppedError(SupervisionError):
    """The proc mesh or actor mesh was stopped; spawn a new one."""


class MeshOwnershipError(SupervisionError):
    """Another controller attached to the mesh after this one: this one may no longer
    command it. ``attach(name)`` takes it back (and fences the other)."""


class AgentUnresponsiveError(SupervisionError):
    """A mesh's host agent runs but does not answer (stopped, hung, or overloaded);
    ``monarch-kernel down NAME`` ends it."""


class MeshUnreachableError(AgentUnresponsiveError):
    """A mesh's state file names agents that cannot be reached from this process (it
    runs on another host, another login node or network namespace, or a partition
    lies between), and nothing here can tell that they are gone: the mesh may well
    run, so its state file stays and no second mesh of its name is made. The message
    names the mesh, its hosts and where to act on it (``monarch-kernel down NAME``
    there)."""


class MeshNotFoundError(MonarchKernelError, LookupError):
    """No running mesh has that name."""


class MeshStateError(MonarchKernelError, OSError):
    """The state folder (``$XDG_STATE_HOME/monarch-kernel``: state files, locks, logs)
    cannot be written (not writable, read-only or full): the message names the folder
    and the way out (make it writable, or set ``XDG_STATE_HOME``)."""


class MessageTooLargeError(MonarchKernelError, ValueError):
    """A message is above the control plane's size limit."""


class SerializationError(MonarchKernelError, TypeError):
    """Arguments or a result cannot be pickled."""


class MeshAuthError(MonarchKernelError):
    """A peer rejected the mesh token."""


class MeshTLSError(MeshAuthError):
    """A TLS handshake with a server of a mesh failed (TLS-2): the server presented a
    certificate the mesh's CA did not sign (it is another mesh's, or an impostor's),
    or only one side speaks TLS (this process lacks the mesh's CA, or the server was
    started without the mesh's identity). The message names the address."""


class MeshSpecError(MonarchKernelError, ValueError):
    """Bad arguments to ``spawn_procs``, ``spawn`` or another call on a mesh (a
    ``tail`` for ``logs()`` out of range)."""


class MeshStartError(MonarchKernelError, RuntimeError):
    """A mesh could not be started: a host agent did not start (ssh failed or was
    refused, srun started too few, the local agent exited at once). Nothing of the
    mesh is left running. Attributes: ``mesh`` and ``host`` where known; the message
    says what the host answered and what to check."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.mesh = details.get("mesh")
        self.host = details.get("host")


class DistributedSetupError(MonarchKernelError, RuntimeError):
    """torch.distributed could not be set up on every proc; the message names the
    ranks that failed and why."""


class RemoteException(MonarchKernelError):
    """An op or ``remote`` function of a mesh tensor failed on a proc (Monarch's
    name). Raised at the sync point that needed its result; the mesh goes on."""

    def __init__(self, op: str, rank: int, message: str, trace: str, mesh: str = "") -> None:
        self.op, self.rank, self.message, self.remote_traceback, self.mesh = op, rank, message, trace, mesh
        where = f"rank {rank}" + (f" of mesh {mesh!r}" if mesh else "")
        super().__init__(
            f"{op} failed on {where}: {message}\n"
            "Everything computed from it is poisoned; the procs go on with later commands.\n"
            f"Remote traceback:\n{trace.rstrip()}"
        )

    def __reduce__(self) -> Any:
        return (RemoteException, (self.op, self.rank, self.message, self.remote_traceback, self.mesh))


class MeshTensorError(MonarchKernelError, ValueError):
    """A mesh tensor used where it cannot be: with a tensor of another mesh, or
    where its values are needed in the controller (``inspect`` fetches them)."""


class UnknownEndpointError(MonarchKernelError, AttributeError):
    """The actor class has no endpoint of that name."""


class DimensionError(MonarchKernelError, TypeError):
    """A mesh has no dimension of that name."""


class MeshIndexError(MonarchKernelError, IndexError):
    """An index is out of range for a mesh dimension."""


class NativeError(MonarchKernelError):
    """The native core failed (a connection, the runtime); raised by ``_native``."""


class ConnectionLost(NativeError):
    """The peer process went away before replying."""


class TransferError(NativeError):
    """A data-plane transfer failed: the sender died, the token was wrong, the buffer
    is gone, or the transfer engine could not start (the message says which)."""
