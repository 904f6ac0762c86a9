"""Supervision of a mesh from its controller: worker deaths, unresponsive workers,
a lost agent, fencing, and who hears of them.

SUPERVISE-1: a worker's exit is known here as soon as the agent reports it, whether a
call is pending or not: its rank is marked dead (later calls needing it fail fast,
other ranks go on), ``on_failure`` callbacks and actors' ``__supervise__`` hooks run,
and with neither the front end (the notebook) or a line on stderr says so.
SUPERVISE-2: a worker that misses ``MISSES`` heartbeats in a row is *unresponsive*
(alive but not answering: SIGSTOP, a hung native call), reported once, distinct from
dead; it is alive again when it answers. A worker that its agent sees running (the
kernel's "R": on a CPU or waiting for one, as on a loaded machine) is busy, not
unresponsive; one whose agent does not answer either is left to the host's checks
(SUPERVISE-4) and to the agent's loss (SUPERVISE-3), never called unresponsive first.
SUPERVISE-3: when the agent itself goes, its workers exit (AGENT-1) and the mesh is
*lost*: every later call fails with a SupervisionError that says so.
SUPERVISE-4: across hosts, a host whose workers and agent stop answering is
*unreachable* (said once, within a few seconds; its ranks' calls wait: RESUME-1),
distinct from lost; it is back when it answers, with nothing lost. A host whose agent
is gone (its address refuses connections) is lost: its ranks are dead, the calls
waiting on them fail, the other hosts go on.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from monarch_kernel import _native
from monarch_kernel.control import ActorFailure, has_exited, worker_dict
from monarch_kernel.controller._frontend import frontend
from monarch_kernel.errors import MonarchKernelError, SupervisionError
from monarch_kernel.mesh import (
    MeshFailure,
    death_error,
    describe,
    dumps,
    escalate,
    loads,
    owner_handles,
    send_calls,
    tail_lines,
    user_fault_hook,
)

if TYPE_CHECKING:
    from monarch_kernel.control import HostLink
    from monarch_kernel.controller._held import HeldMesh

#: Heartbeat period and the misses that make a worker unresponsive (SUPERVISE-2).
HEARTBEAT_S = 1.0
MISSES = 3
#: SUPERVISE-4: how long a host whose agent's port takes connections but whose agent
#: does not answer ("mute") may stay so before it is unreachable. A host busy starting
#: hundreds of workers answers within seconds; a stopped agent never does. A port that
#: takes no connection (a partition) is unreachable at the second missed heartbeat.
MUTE_S = 10.0
#: What a line on stderr adds to a failure nobody handled.
_HINTS = {
    "dead": "calls that need it fail; procs.respawn() restarts it",
    "unresponsive": "calls to it wait; it is alive but does not answer",
    "recovered": "it answers again",
    "lost": "",
    "fenced": "",
    "stopped": "",
    "unreachable": "calls to its ranks wait until it answers",
    "host_back": "",
    "host_lost": "calls that need its ranks fail; the other hosts go on",
    "actor_failed": "",
}
#: The kinds that are failures: they go up the supervision tree when unhandled (OWN-1).
_FAILURES = frozenset({"dead", "lost", "host_lost", "actor_failed"})

#: Who stopped a mesh, as the agent says it (``Stopping.by``), in words.
_STOPPED_BY = {
    "administrator": "an administrator (monarch-kernel down, or %mesh down from another controller)",
    "controller": "its controller",
    "idle timeout": "its idle timeout",
}


class Supervisor:
    """Watches one session's mesh (see the module docstring): the session's watch
    thread hands it worker exits and the agent's loss, its own thread sends the
    heartbeats."""

    def __init__(self, session: HeldMesh) -> None:
        self.s = session
        #: The watch and the heartbeat may both see one death.
        self._dead_lock = threading.Lock()
        #: Whether each actor mesh's class defines __supervise__ (where known).
        self.supervised: dict[str, bool] = {}
        #: Hosts whose agent did not answer the last look (SUPERVISE-4), by link index.
        self._agent_silent: set[int] = set()
        #: Since when each host's agent has been "mute" (``HostLink.reach``).
        self._mute_since: dict[int, float] = {}
        self._thread = threading.Thread(
            target=self._beat, name=f"monarch-heartbeat-{session.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def agent_lost(self, err: BaseException) -> None:
        """SUPERVISE-3: the agent is gone, and with it every worker."""
        s = self.s
        if s.rec.hosts:
            why = (
                s.explain_host_loss(wait=3.0) or f"the host agents of every host went away (the last: {err})"
            )
        else:
            why = f"its host agent ({s.rec.agent_addr}, pid {s.rec.agent_pid}) went away ({err})"
        lost = SupervisionError(
            f"mesh {s.name!r} is lost: {why}, and its workers exit with it. Start it again with "
            f"spawn_procs(..., name={s.name!r}).",
            mesh=s.name,
        )
        s.state.lost = lost
        s.state.changed()
        s.forget_record()
        self.notify(MeshFailure.of(lost, "lost"))

    # -- hosts (SUPERVISE-4) --------------------------------------------------------------

    def host_unreachable(self, link: HostLink) -> None:
        s = self.s
        if s.closed or s.stopping:
            return
        with self._dead_lock:
            if link.index in s.unreachable:
                return
            s.unreachable.add(link.index)
        s.state.changed()
        self.notify(
            MeshFailure(
                s.name,
                "unreachable",
                f"host {link.host!r} of mesh {s.name!r} ({link.addr}, ranks {_span(link)}) does not answer: "
                "neither its agent nor its workers reply (a network partition, or its agent is stopped). "
                "Calls to its ranks wait; it is back, with nothing lost, when it answers.",
                host=link.host,
            )
        )

    def host_back(self, link: HostLink) -> None:
        s = self.s
        with self._dead_lock:
            if link.index not in s.unreachable:
                return
            s.unreachable.discard(link.index)
        s.state.changed()
        self.notify(
            MeshFailure(
                s.name,
                "host_back",
                f"host {link.host!r} of mesh {s.name!r} answers again (ranks {_span(link)})",
                host=link.host,
            )
        )

    def host_lost(self, link: HostLink, err: BaseException) -> None:
        """SUPERVISE-4: a host's agent is gone: its ranks are dead; the other hosts go on.
        Nothing to tell once the mesh is stopping or stopped (its hosts go then)."""
        s = self.s
        if s.closed or s.stopping:
            return
        with self._dead_lock:  # the watch's end and the heartbeat may both see it
            if link.index in s.lost_hosts:
                return
            s.lost_hosts.add(link.index)
        others = [lk for lk in s.client.links if lk.index != link.index and lk.index not in s.lost_hosts]
        s.unreachable.discard(link.index)
        if not others:
            self.agent_lost(err)
            return
        why = s.explain_host_loss(host=link.host) or f"its agent at {link.addr} went away ({err})"
        message = (
            f"host {link.host!r} of mesh {s.name!r} is lost: {why}; its ranks {_span(link)} are gone "
            "with it. The other hosts go on; calls that need those ranks fail."
        )
        with self._dead_lock:
            for r in link.ranks:
                s.state.dead[r] = SupervisionError(message, mesh=s.name, rank=r, host=link.host)
                s.state.unresponsive.discard(r)
        s.state.changed()
        s.state.ref.abandon_calls(message, host=link.index)
        self.notify(MeshFailure(s.name, "host_lost", message, host=link.host))

    def stopped_by(self, by: str) -> None:
        """The agent is stopping the mesh at someone else's request (``by``): its
        workers' exits are that stop, not failures; said once."""
        s = self.s
        s.stopping = True
        s.state.stopped = True
        s.state.changed()
        who = _STOPPED_BY.get(by, by or "someone")
        self.notify(
            MeshFailure(
                s.name,
                "stopped",
                f"mesh {s.name!r} was stopped by {who}; its workers exit. Start it again with "
                f"this_host().spawn_procs(..., name={s.name!r}) (or %mesh up {s.name} --procs N).",
            )
        )

    def worker_died(self, w: Any, notify: bool, gone: set[int] | None = None) -> None:
        """SUPERVISE-1: worker ``w`` (the agent's WorkerInfo) exited. ``gone``: the ranks
        a listing just made says have exited (else the agents are asked)."""
        s = self.s
        info = worker_dict(w)
        rank = info["rank"]
        if s.closed or s.stopping:
            # A stop's own exits: recorded, with nothing asked of the agents (each exit
            # asked every host, so a stop of N procs on H hosts made N x H requests, some
            # of them while the interpreter was ending).
            info["log_tail"], gone = [], set(range(s.nprocs))
        else:
            try:
                info["log_tail"] = list(s.client.logs(rank=rank, tail=tail_lines(info)))
            except MonarchKernelError:
                info["log_tail"] = []
            if gone is None:
                try:  # (all ranks may be going at once: the agent knows which have)
                    gone = {w.rank for w in s.client.list_workers_raw() if has_exited(w)}
                except MonarchKernelError:
                    gone = set(s.state.dead)
        others = any(r != rank and r not in gone and r not in s.state.dead for r in range(s.nprocs))
        err = death_error(s.name, rank, info, None, others_alive=others)
        with self._dead_lock:  # the watch and the heartbeat may both see it
            known = s.state.dead.get(info["rank"])
            if known is not None and known.pid == info["pid"]:
                return
            s.state.dead[info["rank"]] = err
            s.state.unresponsive.discard(info["rank"])
            s.state.changed()
        # Its calls fail now, not when its address refuses: a child it forked may still
        # hold its listening socket, and a broken connection is otherwise resumed (RESUME-1).
        if info.get("addr"):
            why = err.args[0] if err.args else str(err)
            _native.abandon_calls(info["addr"], s.state.ref.token, why)
            _native.abandon_relayed_calls(s.state.ref.token, [rank], why)
        if notify and not (s.closed or s.stopping):
            self.notify(MeshFailure.of(err, "dead"))

    def notify(self, failure: MeshFailure) -> None:
        """Tells whoever listens of ``failure``: ``on_failure`` callbacks and the
        ``__supervise__`` hooks of the mesh's other actors; else (OWN-1) the owner
        actor's ``__supervise__`` and then the owner's own controller, for a mesh an
        actor owns; else ``unhandled_fault_hook`` if the user set one; else the
        front end or a line on stderr."""
        handled = False
        for cb in list(self.s.callbacks):
            handled = True
            try:
                cb(failure)
            except Exception as e:
                print(f"monarch: on_failure callback {cb!r} raised {type(e).__name__}: {e}", file=sys.stderr)
        if failure.kind in ("dead", "unresponsive"):
            handled = self._supervise(failure) or handled
        if not handled and failure.kind in _FAILURES:
            handled = (
                owner_handles(self.s.name, failure)
                or escalate(self.s.name, failure)
                or user_fault_hook(failure)
            )
        sink = frontend().on_failure
        if not handled and sink is not None:
            sink(failure)
        elif not handled:
            hint = _HINTS[failure.kind]
            text = failure.message if failure.kind == "actor_failed" else failure.message.splitlines()[0]
            print(f"monarch: {text}{f' ({hint})' if hint else ''}", file=sys.stderr, flush=True)

    def actor_failed(self, failure: ActorFailure) -> None:
        """OWN-1: a worker said one of its actors failed (``ACTOR_FAILURE_MARK``)."""
        self.notify(MeshFailure(self.s.name, "actor_failed", failure.message, failure.rank))

    def _supervise(self, failure: MeshFailure) -> bool:
        """Sends ``__supervise__(failure)`` to the live actors of every actor mesh
        that spans the failed rank and whose class defines it; True if any did."""
        s = self.s
        any_hook = False
        for name, (payload, buffers, shape_blob) in list(s.records.items()):
            supervised = self.supervised.get(name)
            try:
                if supervised is None:  # a record from another controller: look once
                    supervised = self.supervised[name] = hasattr(loads(payload, buffers)[0], "__supervise__")
                if not supervised:
                    continue
                shape = loads(shape_blob)
            except Exception:
                continue
            if failure.rank not in shape.ranks:
                continue
            local = [i for i, r in enumerate(shape.ranks) if r not in s.state.dead and r != failure.rank]
            if not local:
                continue
            procs = [shape.ranks[i] for i in local]
            conns = s.state.connect(procs)
            data, raws = dumps(((failure,), {}), "supervision event")
            target = _native.Endpoint(name, "__supervise__", list(shape.labels), list(shape.extent.sizes))
            # (across hosts through the relays, as the mesh's calls: START-1)
            send_calls(s.state.ref.fanout(), target, conns, procs, local, data, raws, True, "")
            any_hook = True
        return any_hook

    # -- heartbeats (SUPERVISE-2) --------------------------------------------------------

    def _beat(self) -> None:
        s = self.s
        misses: dict[int, int] = {}
        while not s.closed and s.state.lost is None and not s.state.stopped:
            started = time.monotonic()
            ranks = [r for r in range(len(s.state.ref.addrs)) if r not in s.state.dead]
            try:  # one message per host: its agent pings its workers
                by_rank = s.client.ping_workers(s.epoch, HEARTBEAT_S)
            except Exception:
                by_rank = {}
            results = [by_rank.get(r) for r in ranks]
            # Ranks their agents say are not running: exits the event stream missed
            # (SUPERVISE-1), asked of their agents once for the round.
            exited = self._exits([r for r, res in zip(ranks, results) if isinstance(res, BaseException)])
            for r, res in zip(ranks, results):
                if s.closed or s.stopping or r in s.state.dead:
                    continue  # (a stop in progress: its exits are not failures)
                if isinstance(res, tuple):
                    misses[r] = 0
                    if res[1] > s.epoch and not s.fenced:
                        self._fence(res[1])
                    if r in s.state.unresponsive:
                        s.state.unresponsive.discard(r)
                        self.notify(
                            MeshFailure(s.name, "recovered", f"rank {r} of mesh {s.name!r} answers again", r)
                        )
                    continue
                if r in exited:
                    continue
                misses[r] = misses.get(r, 0) + 1
                host = s.host_index(r)
                if misses[r] >= MISSES and r not in s.state.unresponsive and host not in s.unreachable:
                    self._silent(r)
            self._check_hosts(misses)
            time.sleep(max(0.0, HEARTBEAT_S - (time.monotonic() - started)))

    def _silent(self, rank: int) -> None:
        """Rank ``rank`` missed ``MISSES`` heartbeats: unresponsive unless its agent
        sees it running (busy: SUPERVISE-2) or does not answer itself (the host's
        checks and the agent's loss say what happened)."""
        s = self.s
        try:
            info = s.client.worker(rank)
        except MonarchKernelError:
            return  # the agent is silent too: not this rank's failure to tell
        if info is None or info.get("proc_state") == "R":
            return
        if info["state"] == "exited":
            self._exits([rank])
            return
        with self._dead_lock:
            if rank in s.state.unresponsive or rank in s.state.dead:
                return
            s.state.unresponsive.add(rank)
        self.notify(MeshFailure.of(self._unresponsive_error(rank, info), "unresponsive"))

    def _check_hosts(self, misses: dict[int, int]) -> None:
        """SUPERVISE-4 (across hosts): when one of a host's live ranks missed the last
        heartbeat, its agent is asked: gone, the host is lost (at once, whatever its
        Watch stream says yet); with every rank silent for two heartbeats and the agent
        silent at either of them, the host is unreachable (one look at the agent per
        heartbeat: the second miss needs no second look to say so). A host whose ranks
        answer again is back."""
        s = self.s
        if len(s.client.links) == 1 or s.closed or s.stopping:
            return  # (a heartbeat that began before a stop: its hosts going is no news)
        for link in s.client.links:
            if link.index in s.lost_hosts:
                continue
            live = [r for r in link.ranks if r not in s.state.dead]
            if not live:
                continue
            silent = min(misses.get(r, 0) for r in live)
            if not max(misses.get(r, 0) for r in live):
                self._agent_silent.discard(link.index)
                self._mute_since.pop(link.index, None)
                if link.index in s.unreachable:
                    self.host_back(link)
                continue
            if link.index in s.unreachable:
                continue
            if silent >= 2 and link.index in self._agent_silent:
                self.host_unreachable(link)
                continue
            how = link.reach(timeout=1.0)
            if how == "gone":
                self.host_lost(link, SupervisionError(f"its agent at {link.addr} refuses connections"))
            elif how == "unreachable":
                self._agent_silent.add(link.index)
                if silent >= 2:
                    self.host_unreachable(link)
            elif how == "mute":  # busy, or stopped: only its lasting tells
                if self.mute_too_long(link) and silent >= 2:
                    self.host_unreachable(link)
            else:
                self._agent_silent.discard(link.index)
                self._mute_since.pop(link.index, None)

    def mute_too_long(self, link: HostLink) -> bool:
        """Host ``link``'s agent was just found "mute" (``HostLink.reach``): whether it
        has been so for ``MUTE_S`` (since the first such look; a look or a heartbeat
        that it answers ends the spell)."""
        since = self._mute_since.setdefault(link.index, time.monotonic())
        return time.monotonic() - since >= MUTE_S

    def _exits(self, ranks: list[int]) -> set[int]:
        """Asks the agents of ``ranks``' hosts, each once, which of ``ranks`` exited, and
        handles those as deaths: exits the watch stream did not deliver (it drops
        events when a reader lags). The ranks handled. One look per heartbeat, not one
        per rank at every agent: a heartbeat that met a stop in progress (no rank
        running) made ranks x hosts looks, 65,536 at 64 x 16, and still made them as
        the interpreter exited."""
        s = self.s
        ranks = [r for r in ranks if r not in s.state.dead]
        if not ranks or s.closed or s.stopping:
            return set()
        try:
            infos = s.client.list_workers_raw(links=s.client.links_of(ranks))
        except MonarchKernelError:
            return set()
        return self.died_in(infos, notify=True, ranks=set(ranks))

    def died_in(self, infos: list[Any], notify: bool, ranks: set[int] | None = None) -> set[int]:
        """Handles as deaths the exited workers (of ``ranks``, if given) in ``infos``,
        an agents' listing just made, whose exits stand for the ranks gone: one
        listing for all of them, not one more per death. The ranks handled."""
        gone = {w.rank for w in infos if has_exited(w)}
        done: set[int] = set()
        for w in infos:
            if w.rank in gone and (ranks is None or w.rank in ranks) and w.rank not in self.s.state.dead:
                self.worker_died(w, notify=notify, gone=gone)
                done.add(w.rank)
        return done

    def _fence(self, epoch: int) -> None:
        """Another controller attached (epoch ``epoch``): stop listening to the mesh,
        say so once."""
        s = self.s
        s.fenced = s.state.fenced = True
        self.notify(
            MeshFailure(
                s.name,
                "fenced",
                f"mesh {s.name!r}: another controller attached (epoch {epoch}; this one has {s.epoch}); "
                f"commands from here now raise MeshOwnershipError. attach({s.name!r}) takes it back.",
            )
        )
        s.detach()

    def _unresponsive_error(self, rank: int, info: dict[str, Any] | None) -> SupervisionError:
        s = self.s
        how = describe(info, f"no heartbeat for {MISSES} s") if info else f"missed {MISSES} heartbeats"
        where = f" (pid {info['pid']} on {info['host']})" if info else ""
        return SupervisionError(
            f"The worker of rank {rank} of mesh {s.name!r}{where} is unresponsive: it {how}",
            mesh=s.name,
            rank=rank,
            pid=info["pid"] if info else None,
            host=info["host"] if info else None,
        )


def _span(link: HostLink) -> str:
    r = link.ranks
    return f"{r.start}-{r.stop - 1}" if len(r) > 1 else str(r.start)


__all__ = ["HEARTBEAT_S", "MISSES", "MeshFailure", "Supervisor"]
