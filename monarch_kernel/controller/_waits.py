"""What a long wait waits for: for each pending call, whether its rank is busy with
another call (which, and where its code is), or does not answer. The notebook says
it while the wait goes on, so a cell never hangs in silence behind a stuck rank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monarch_kernel.controller._session import Session, sessions


def describe_wait(calls: Sequence[Any]) -> list[str]:
    """One line per rank that a pending call of ``calls`` waits on behind something
    else, or that does not answer; nothing for ranks simply running the call."""
    where: dict[str, tuple[Session, int]] = {}
    for s in list(sessions.values()):
        if not s.closed:
            for r, addr in enumerate(s.state.ref.addrs):
                where[addr] = (s, r)
    lines: list[str] = []
    seen: set[tuple[str, int]] = set()
    for c in calls:
        if c.done() or c.addr not in where:
            continue
        s, r = where[c.addr]
        if (s.name, r) in seen:
            continue
        seen.add((s.name, r))
        rank = f"rank {r} of mesh {s.name!r}"
        try:
            running = s.busy(r)
        except TimeoutError:
            if not _stuck(s, r):
                continue
            lines.append(
                f"{rank} does not answer (stopped, or hung in native code); %mesh stacks shows what "
                f"it runs, stop ends the wait, and a worker that stays hung can be killed and then "
                f"restarted with procs.respawn()."
            )
            continue
        except Exception:
            continue
        if any(call_id == c.call_id for call_id, _w, _f in running):
            continue  # it runs this call itself
        ahead = [(what, frame) for _id, what, frame in running]
        if ahead:
            what, frame = ahead[0]
            lines.append(
                f"{rank} is busy with {what}, now in {frame}; this call waits behind it. "
                "%mesh stacks shows more; stop interrupts it (pressed twice, it ends that worker; "
                "procs.respawn() restarts it)."
            )
    return lines


def calls_of(futures: Sequence[Any]) -> list[Any]:
    """The native calls behind ``futures`` that have not replied yet."""
    return [c for f in futures for c in f._calls if not c.done()]


__all__ = ["calls_of", "describe_wait"]


def _stuck(s: Session, rank: int) -> bool:
    """Whether worker ``rank``, which did not say what it runs in time, is stuck as its
    agent sees it: not running (stopped, or asleep in a hung native call) and not
    exited. One the agent sees running (the kernel's "R": busy with its interpreter, an
    import, or starved on a loaded machine) is busy, not hung (SUPERVISE-2); with an
    agent that does not answer either, the host's notices say what happened (lost, or
    unreachable), not this line."""
    if rank in s.state.unresponsive:
        return True
    try:
        info = s.client.worker(rank)
    except Exception:
        return False
    return info is not None and info["state"] != "exited" and info.get("proc_state") != "R"
