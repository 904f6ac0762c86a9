"""Monarch's debugging example (``docs/source/examples/debugging.py``), answered through
the monarch kernel, driven with jupyter_client as the kernel tests drive it.

The example's program calls an endpoint with a ``breakpoint()`` on a mesh of 4 x 4
procs; from another terminal, ``monarch debug`` lists the ranks stopped there,
attaches to one (``attach debugee 13``: ``s``, ``n``, ``rank``), casts pdb commands to
several (``cast debugee ranks(...) CMD``), continues them all, and debugs the rank
whose endpoint raised. In the notebook, each of these is a cell: the call is made
without waiting (so its ranks wait in pdb, "parked"), and ``%mesh debug`` lists them,
attaches to one (``--rank R``), sends one command to many (``--ranks R,... --cmd
CMD``, Monarch's ``cast``: ranks are flat here, ``ranks(2:7:2)`` is ``2,4,6``), and
debugs a rank's last exception (``--post-mortem R``; Monarch stops there by itself).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.kernel.kernel_harness import TIMEOUT, Kernel, Outcome, start, stop

#: The example's actor, as a cell.
DEFINE = """
from monarch_kernel import Actor, current_rank, endpoint, this_host


def _bad_rank():
    raise ValueError("bad rank")


def _debugee_actor_internal(rank):
    if rank % 4 == 0:
        rank += 1
        return rank
    elif rank % 4 == 1:
        rank += 2
        return rank
    elif rank % 4 == 2:
        rank += 3
        _bad_rank()
    elif rank % 4 == 3:
        rank += 4
        return rank


class DebugeeActor(Actor):
    @endpoint
    def to_debug(self):
        rank = current_rank().rank
        breakpoint()  # noqa
        return _debugee_actor_internal(rank)
"""

#: The example's main, but for the wait: the call is left running, to debug it from
#: the cells that follow (where Monarch's user goes to another terminal).
SPAWN_AND_CALL = """
# Create a mesh with 4 "hosts" and 4 gpus per "host"
process_mesh = this_host().spawn_procs(per_host={"host": 4, "gpu": 4})

# Spawn the actor you want to debug on the mesh
debugee_mesh = process_mesh.spawn("debugee", DebugeeActor)

# Call the endpoint you want to debug
fut = debugee_mesh.to_debug.call()
process_mesh.name
"""


@pytest.fixture(scope="module")
def kernel(jupyter_path: None) -> Iterator[Kernel]:
    k = start()
    try:
        k.run("1")  # the start line
        yield k
    finally:
        k.run("%mesh down --all")
        stop(k)


class Session:
    """The cells a test runs, and everything they printed (a worker's pdb output
    shows in whichever cell runs when it comes)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.transcript = ""

    def run(self, code: str) -> Outcome:
        out = self.kernel.run(code)
        self.transcript += out.stdout
        return out

    def answer(self, code: str, lines: list[str]) -> tuple[Outcome, list[str]]:
        """Runs ``code`` and answers the input requests it makes with ``lines``; the
        outcome and the prompts."""
        out = Outcome(self.kernel.kc.execute(code, allow_stdin=True))
        prompts = []
        for line in lines:
            msg = self.kernel.kc.get_stdin_msg(timeout=TIMEOUT)
            assert msg["msg_type"] == "input_request"
            prompts.append(msg["content"]["prompt"])
            self.kernel.kc.input(line)
        self.kernel.collect(out)
        self.transcript += out.stdout
        return out, prompts

    def waiting(self, mesh: str) -> set[int]:
        """The ranks of ``mesh`` that wait in pdb (``%mesh debug``, Monarch's ``list``)."""
        listed = self.run("%mesh debug").stdout
        return {
            int(line.split("]")[0].split()[-1])
            for line in listed.splitlines()
            if line.startswith(f"[{mesh} ") and "waiting in pdb" in line
        }

    def wait_until_waiting(self, mesh: str, ranks: set[int]) -> set[int]:
        """The waiting ranks, once ``ranks`` are among them (or after a minute)."""
        deadline = time.monotonic() + TIMEOUT
        waiting = self.waiting(mesh)
        while not ranks <= waiting and time.monotonic() < deadline:
            time.sleep(0.3)
            waiting = self.waiting(mesh)
        return waiting

    def cast(self, mesh: str, ranks: str | None, command: str) -> list[int]:
        """``%mesh debug MESH --ranks RANKS --cmd COMMAND`` (every waiting rank without
        ``ranks``): the ranks that took it."""
        only = f" --ranks {ranks}" if ranks is not None else ""
        out = self.run(f"%mesh debug {mesh}{only} --cmd {command}")
        assert out.error is None, out.traceback
        return sorted(
            int(line.split("]")[0].split()[-1])
            for line in out.stdout.splitlines()
            if line.startswith(f"[{mesh} ") and line.endswith(f"] {command}")
        )


@pytest.mark.slow
def test_breakpoints_on_sixteen_ranks_are_listed_attached_cast_to_continued_and_debugged_post_mortem(kernel):
    """The whole example: 16 ranks stop at ``breakpoint()``; ``%mesh debug`` lists
    them; attached to rank 13, ``s``, ``n`` and ``rank`` step into
    ``_debugee_actor_internal`` and show 13; commands cast to ranks 0,1 (``n``), to
    2,4,6 (``s``) and to the ranks of hosts 2-3 and gpus 1-2 (``c``) reach those that
    wait; ``c`` to all lets the call finish, with the ``ValueError`` of the ranks
    where ``rank % 4 == 2``; post-mortem on rank 2 stands where it was raised."""
    s = Session(kernel)
    out = s.run(DEFINE)
    assert out.error is None, out.traceback
    out = s.run(SPAWN_AND_CALL)
    assert out.error is None, out.traceback
    mesh = out.result.strip("'\"") if out.result else ""
    assert mesh, out.stdout
    try:
        # "list": every rank stopped at the breakpoint.
        assert s.wait_until_waiting(mesh, set(range(16))) == set(range(16))

        # "attach debugee 13", then s, n and rank (and c: the endpoint goes on and
        # returns, which ends the attachment).
        out, prompts = s.answer("%mesh debug --rank 13", ["s", "n", "rank", "c"])
        assert out.error is None, out.traceback
        assert prompts == [f"[{mesh} 13] (Pdb) "] * 4
        assert f"[{mesh} 13] --Call--" in out.stdout
        assert "_debugee_actor_internal()" in out.stdout
        assert f"[{mesh} 13] -> if rank % 4 == 0:" in out.stdout
        assert f"[{mesh} 13] 13\n" in out.stdout
        assert 13 not in s.waiting(mesh)

        # "cast debugee ranks(0,1) n"
        assert s.cast(mesh, "0,1", "n") == [0, 1]
        s.wait_until_waiting(mesh, {0, 1})
        # "cast debugee ranks(2:7:2) s"
        assert s.cast(mesh, "2,4,6", "s") == [2, 4, 6]
        s.wait_until_waiting(mesh, {2, 4, 6})
        # "cast debugee ranks(host=2:4, gpus=1:3) c": ranks 9, 10, 13, 14 (13 runs no more)
        assert s.cast(mesh, "9-10,13-14", "c") == [9, 10, 14]

        # "Continuing Execution": c to every rank that still waits.
        rest = sorted(set(range(16)) - {9, 10, 13, 14})
        assert s.cast(mesh, None, "c") == rest
        deadline = time.monotonic() + TIMEOUT
        while s.waiting(mesh) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert "no rank is waiting in pdb" in s.run("%mesh debug").stdout

        # The call ends with the error of the ranks where rank % 4 == 2.
        out = s.run("fut.get()")
        assert out.error is not None and out.error["ename"] == "ActorError", out.traceback
        assert "ValueError: bad rank" in out.traceback

        # What pdb showed on the way: n on ranks 0 and 1 ran to the return of their
        # values (1 and 3); s on 2, 4 and 6 went into _debugee_actor_internal.
        assert "to_debug()->1" in s.transcript and "to_debug()->3" in s.transcript, s.transcript
        for rank in (2, 4, 6):
            assert f"[{mesh} {rank}] --Call--" in s.transcript, s.transcript

        # "Post-Mortem Debugging": rank 2, where its ValueError was raised.
        out, prompts = s.answer(f"%mesh debug {mesh} --post-mortem 2", ["up", "rank", "q"])
        assert out.error is None, out.traceback
        assert prompts == [f"[{mesh} 2] (Pdb) "] * 3
        assert f'[{mesh} 2] -> raise ValueError("bad rank")' in out.stdout
        assert f"[{mesh} 2] 5\n" in out.stdout  # rank 2 + 3, in _debugee_actor_internal
    finally:
        s.run("process_mesh.stop()")
