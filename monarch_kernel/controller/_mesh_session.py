"""``MeshSession``: what a front end (the Jupyter kernel, a script's tools) may do
with a mesh this process controls. ``controller.session(name)`` returns one; the
``Session`` behind it (its lease, supervision, state file, connections) stays inside
the controller, so a front end cannot reach past this list, and mypy checks that it
does not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from monarch_kernel.control import LineWindow
    from monarch_kernel.mesh import Future, ProcMesh


class MeshSession(Protocol):
    """A mesh this process controls, as its front ends see it."""

    #: The mesh's name, its token (tags its workers' output) and this lease's epoch.
    name: str
    token: str
    epoch: int
    #: The mesh's dimensions, in order.
    sizes: dict[str, int]
    #: The actor meshes spawned on it, by name (what a reattach respawns).
    records: dict[str, tuple[bytes, list[bytes], bytes]]
    #: ``logging_option(aggregate_window_sec=)``: where text lines are held to be
    #: merged (they come back through the front end's ``on_merged``); None: no window.
    window: LineWindow | None

    @property
    def nprocs(self) -> int: ...

    def procs(self) -> ProcMesh:
        """The whole proc mesh."""
        ...

    def calls_in_flight(self, ranks: list[int], timeout: float = 2.0) -> dict[int, int]:
        """How many calls each of workers ``ranks`` holds unanswered now (those that say)."""
        ...

    def flush(self, origin: str, timeout: float = 5.0) -> list[int]:
        """Has every live worker mark the end of ``origin``'s output; the ranks that did."""
        ...

    def send_builtin(self, rank: int, method: str, *args: Any) -> None:
        """Calls ``method`` of rank ``rank``'s built-in actor, without waiting."""
        ...

    def post_mortem(self, rank: int) -> Future[None]:
        """pdb on worker ``rank``'s last exception."""
        ...

    def pdb_input(self, rank: int, line: str, timeout: float = 10.0) -> bool:
        """``line`` to the debugger waiting on worker ``rank``; True if one was."""
        ...

    def stacks(self, ranks: list[int], timeout: float = 10.0) -> list[str]:
        """The Python stacks of workers ``ranks``."""
        ...

    def logs(self, rank: int | None, tail: int, labelled: bool = False) -> list[str]:
        """The last ``tail`` lines of worker output (of ``rank``, or of all)."""
        ...
