"""``AgentGroup``: the host agents of one mesh, one per host, spoken to as one.

A mesh on one host has one agent; a mesh across hosts has one on each, and each owns
the workers of its host (a contiguous range of ranks, host by host). The group sends
a command for some ranks to the agents that own them, and a command for the mesh to
every agent (in parallel). GROUP-1: an agent that does not answer never hides what
the others say: a listing gives the ranks that answered, and a command to every host
reaches every host that answers before the first error is raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from monarch_kernel.control._agent_client import AgentClient, log_texts, worker_dict
from monarch_kernel.errors import MonarchKernelError

#: How many hosts a command to every host is in flight to at once. A command's
#: thread mostly waits for its host (a spawn waits for the workers to start):
#: 16 at once made 64 hosts' bring-up four waves, one after the other.
IN_FLIGHT = 128


@dataclass
class HostLink:
    """One host of a mesh: its agent's client and the ranks of its workers."""

    index: int
    client: AgentClient
    #: The host's name, as its agent reports it.
    host: str
    first_rank: int
    nprocs: int
    agent_pid: int = 0

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nprocs)

    @property
    def addr(self) -> str:
        return self.client.addr

    def reach(self, timeout: float = 2.0) -> str:
        """Whether the host's agent answers ("alive"), its host answers but not on the
        agent's port ("gone": connection refused), its port takes a connection but the
        agent does not answer within ``timeout`` ("mute": a host too busy to answer in
        time, or a stopped agent: only its lasting tells them apart), or nothing answers
        ("unreachable": a partition). The port is tried with a plain connection first:
        the gRPC channel's own state lags after a loss."""
        import socket

        host, port = self.addr.rsplit(":", 1)
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except ConnectionRefusedError:
            return "gone"
        except OSError:
            return "unreachable"
        try:
            self.client.ping(timeout=timeout)
            return "alive"
        except MonarchKernelError:
            return "mute"


class AgentGroup:
    """The agents of one mesh (see the module docstring)."""

    def __init__(self, links: Sequence[HostLink]) -> None:
        self.links = list(links)

    @property
    def addr(self) -> str:
        """The first host's agent (the one a single-host mesh has)."""
        return self.links[0].addr

    def link_of(self, rank: int) -> HostLink:
        for link in self.links:
            if rank in link.ranks:
                return link
        return self.links[-1]  # ranks past the end: the agent says they are unknown

    def each(self, fn: Callable[[HostLink], Any], links: Sequence[HostLink] | None = None) -> list[Any]:
        """``fn(link)`` on every link (in parallel when there are several): the results,
        or raises the first error once every link is done (GROUP-1)."""
        targets = self.links if links is None else list(links)
        if len(targets) == 1:
            return [fn(targets[0])]
        futures, rest = [], []
        with ThreadPoolExecutor(max_workers=min(IN_FLIGHT, len(targets))) as pool:
            for i, link in enumerate(targets):
                try:
                    futures.append(pool.submit(fn, link))
                except RuntimeError:  # the interpreter is exiting: executors take no more
                    rest = targets[i:]  # (a supervision thread still at work: these
                    break  # go one by one here, rather than a traceback)
        outcomes: list[tuple[Any, BaseException | None]] = [
            (None, f.exception()) if f.exception() is not None else (f.result(), None) for f in futures
        ]
        for link in rest:
            try:
                outcomes.append((fn(link), None))
            except Exception as e:
                outcomes.append((None, e))
        errors = [e for _, e in outcomes if e is not None]
        if errors:
            raise errors[0]
        return [v for v, _ in outcomes]

    def links_of(self, ranks: Sequence[int]) -> list[HostLink]:
        """The links of the hosts that run ``ranks``, each once, in host order."""
        wanted = {self.link_of(r).index for r in ranks}
        return [link for link in self.links if link.index in wanted]

    def _answering(
        self, fn: Callable[[HostLink], list[Any]], links: Sequence[HostLink] | None = None
    ) -> list[Any]:
        """The concatenated results of the links (default: all) that answer (GROUP-1);
        raises only when none does."""
        out: list[Any] = []
        failures: list[MonarchKernelError] = []

        def one(link: HostLink) -> list[Any]:
            try:
                return fn(link)
            except MonarchKernelError as e:
                failures.append(e)
                return []

        targets = self.links if links is None else list(links)
        for part in self.each(one, targets):
            out.extend(part)
        if failures and len(failures) == len(targets):
            raise failures[0]
        return out

    # -- what the mesh's workers are ------------------------------------------------------

    def _pings(self, epoch: int, timeout: float, usage: bool) -> dict[int, Any]:
        """Each rank's ``WorkerPing`` from its host's agent (one message per host), an
        exception for a rank not running on its host, None where its agent did not
        answer."""
        from monarch_kernel import _native
        from monarch_kernel.v1 import agent_pb2

        # WATCH-1: one native wait for every agent's answer (grpcio started a polling
        # thread per channel for each heartbeat's call)
        answers = _native.ping_agents(
            [link.client.native() for link in self.links], epoch, max(10, int(timeout * 1000)), usage
        )
        out: dict[int, Any] = {}
        for link, answer in zip(self.links, answers):
            if not isinstance(answer, bytes):  # the agent did not answer: its ranks say nothing
                out.update(dict.fromkeys(link.ranks))
                continue
            pings = {p.rank: p for p in agent_pb2.PingWorkersReply.FromString(answer).pings}
            for r in link.ranks:
                p = pings.get(r)
                out[r] = MonarchKernelError(f"rank {r} is not running on {link.host}") if p is None else p
        return out

    def ping_workers(self, epoch: int, timeout: float) -> dict[int, Any]:
        """SUPERVISE-2, one message per host: each agent pings its running workers
        (passing ``epoch``) and answers for all of them. By rank: ``(pid, epoch)`` for
        an answer, an exception for a worker that could not be reached or is not
        running on its host, None for no answer (or no answer from its agent)."""
        out: dict[int, Any] = {}
        for r, p in self._pings(epoch, timeout, False).items():
            if p is None or isinstance(p, BaseException):
                out[r] = p
            elif p.answered:
                out[r] = (p.pid, p.epoch)
            else:
                out[r] = MonarchKernelError(p.error) if p.error else None
        return out

    def usage(self, timeout: float) -> dict[int, dict[str, Any] | None]:
        """VIEW-2, one message per host, as an administrator (epoch 0): what each
        running worker that answered within ``timeout`` uses, as its agent reads it
        from /proc (``{"cpu": %, "rss": bytes}``); None for a rank that did not answer."""
        return {
            r: {"cpu": round(p.cpu), "rss": p.rss}
            if not (p is None or isinstance(p, BaseException)) and p.answered and p.measured
            else None
            for r, p in self._pings(0, timeout, True).items()
        }

    def list_workers_raw(self, timeout: float = 5.0, links: Sequence[HostLink] | None = None) -> list[Any]:
        """The agents' ``WorkerInfo`` of every worker (or of the hosts ``links``), by rank."""
        return sorted(
            self._answering(lambda link: link.client.list_workers_raw(timeout), links), key=lambda w: w.rank
        )

    def list_workers(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        return [worker_dict(w) for w in self.list_workers_raw(timeout)]

    def worker(self, rank: int) -> dict[str, Any] | None:
        return self.link_of(rank).client.worker(rank)

    def logs(
        self, rank: int | None = None, tail: int = 100, timeout: float = 5.0, labelled: bool = False
    ) -> list[str]:
        """The last ``tail`` lines of ``rank``, or of each rank: then in the order they
        were printed, across hosts too (``labelled``: see ``log_texts``)."""
        if rank is not None:
            lines = self.link_of(rank).client.log_lines(rank=rank, tail=tail, timeout=timeout)
        else:
            lines = self._answering(lambda link: link.client.log_lines(rank=None, tail=tail, timeout=timeout))
            lines.sort(key=lambda ln: ln.time_us)
        return log_texts(lines, labelled)

    # -- commands -------------------------------------------------------------------------

    def ping(self, timeout: float = 5.0) -> dict[str, Any]:
        """The first host's agent's ping, with the lowest epoch of every host's."""
        pings = self.each(lambda link: link.client.ping(timeout))
        return {**pings[0], "epoch": min(p["epoch"] for p in pings)}

    def attach(self, timeout: float = 10.0) -> list[Any]:
        """Becomes the controller on every host at one epoch (above each host's), so
        that a controller fenced on one host is fenced on all; the AttachReplies."""
        at_least = 0
        if len(self.links) > 1:
            at_least = max(p["epoch"] for p in self.each(lambda link: link.client.ping(timeout))) + 1
        return self.each(lambda link: link.client.attach(at_least=at_least, timeout=timeout))

    def record_actor(
        self, name: str, payload: bytes, buffers: list[Any], shape: bytes, epoch: int, timeout: float = 10.0
    ) -> None:
        self.each(lambda link: link.client.record_actor(name, payload, buffers, shape, epoch, timeout))

    def forget_actor(self, name: str, epoch: int, timeout: float = 10.0) -> None:
        self.each(lambda link: link.client.forget_actor(name, epoch, timeout))

    def spawn_workers_raw(
        self,
        executable: str,
        args: list[str],
        env: dict[str, str],
        cwd: str,
        epoch: int,
        timeout: float = 60.0,
    ) -> list[Any]:
        """Starts every host's workers (each its ``nprocs``, ranked from its
        ``first_rank``), in parallel; the WorkerInfo messages in rank order."""
        parts = self.each(
            lambda link: link.client.spawn_workers_raw(
                link.nprocs,
                executable,
                args,
                env,
                cwd,
                epoch=epoch,
                timeout=timeout,
                first_rank=link.first_rank,
            )
        )
        return sorted((w for part in parts for w in part), key=lambda w: w.rank)

    def respawn_workers(self, ranks: list[int], epoch: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        owners = [link for link in self.links if any(r in link.ranks for r in ranks)]
        parts = self.each(
            lambda link: link.client.respawn_workers([r for r in ranks if r in link.ranks], epoch, timeout),
            owners,
        )
        return [w for part in parts for w in part]

    def shutdown(self, epoch: int = 0, timeout: float = 15.0) -> None:
        self.each(lambda link: link.client.shutdown(epoch, timeout))

    def close(self) -> None:
        for link in self.links:
            link.client.close()

    # -- events ---------------------------------------------------------------------------

    def watch_link(
        self,
        link: HostLink,
        on_event: Callable[[Any], None],
        on_end: Callable[[BaseException | None, HostLink], None],
    ) -> Callable[[], None]:
        """A new ``Watch`` stream on one host (after its last one ended)."""
        return link.client.watch_in_thread(on_event, lambda err: on_end(err, link))

    def watch(self) -> Generator[Any, None, None]:
        """Every host's events as they come, merged (iterate; ``close()`` ends it)."""
        if len(self.links) == 1:
            stream = self.links[0].client.watch()
            try:
                yield from stream
            finally:
                stream.cancel()
            return
        import queue

        events: queue.Queue[Any] = queue.Queue()
        streams = [link.client.watch() for link in self.links]

        def pump(stream: Any) -> None:
            try:
                for ev in stream:
                    events.put(ev)
            except Exception:
                pass

        for s in streams:
            threading.Thread(target=pump, args=(s,), daemon=True, name="monarch-watch-merge").start()
        try:
            while True:
                yield events.get()
        finally:
            for s in streams:
                s.cancel()


def single(client: AgentClient, nprocs: int, host: str = "", agent_pid: int = 0) -> AgentGroup:
    """The group of a mesh on one host."""
    return AgentGroup([HostLink(0, client, host, 0, nprocs, agent_pid)])


__all__ = ["AgentGroup", "HostLink", "single"]
