"""Worker output, with real workers: a rank's last lines (``logs``), all ranks'
in the order printed, new lines as they come (``stream_logs``), a controller that
falls behind, and a plain script printing its workers' lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

from mortal import proc_rank
from proc_helpers import WITHIN, logged, wait_for

from monarch_kernel import Actor, endpoint

TIMEOUT = 30


class Speaker(Actor):
    @endpoint
    def say(self, text: str) -> None:
        print(f"{text} from rank {proc_rank()}", flush=True)

    @endpoint
    def flood(self, lines: int) -> None:
        pad = "." * 200  # long lines: the transport's buffers hold fewer of them
        for i in range(lines):
            print(pad, "flood", i)
        sys.stdout.flush()

    @endpoint
    def chat(self, lines: int) -> None:
        for i in range(lines):
            print("c", i)  # short lines: one small HTTP/2 frame each
        sys.stdout.flush()


def _printed_here(capfd: Any, texts: list[str]) -> None:
    """This script's session prints every rank's lines as they come (its watch
    thread): waits (a while at most) until ``texts`` are in this test's captured
    output, so none is printed after the test, outside any capture. Not a check of
    the forwarding (``test_a_plain_script_prints_worker_output_with_mesh_and_rank`` is): where the
    session's stdout is another capture's, the lines never come here."""
    printed = ""
    deadline = time.monotonic() + 5.0
    while not all(t in printed for t in texts) and time.monotonic() < deadline:
        printed += capfd.readouterr().out
        time.sleep(0.05)


# -- output --------------------------------------------------------------------------


def test_logs_gives_the_last_lines_of_one_rank(fresh_procs2, capfd):
    mesh = fresh_procs2.spawn("speaker", Speaker)
    mesh.say.call("hello").get(timeout=TIMEOUT)
    lines = wait_for(
        lambda: [ln for ln in fresh_procs2.logs(rank=1, tail=5) if "hello from" in ln], every=0.1
    )
    assert lines == ["hello from rank 1"]
    both = logged(fresh_procs2, "hello from", count=2, tail=100)
    assert both == ["hello from rank 0", "hello from rank 1"]
    _printed_here(capfd, both)


def test_logs_of_every_rank_come_in_the_order_they_were_printed_labelled(fresh_procs2, capfd):
    mesh = fresh_procs2.spawn("speaker_order", Speaker)
    # rank 1, 0, 1, 0 in turn, each line recorded by the agent before the next is printed
    said = []
    for i, rank in enumerate([1, 0, 1, 0]):
        text = f"turn {i}"
        mesh.slice(procs=rank).say.call(text).get(timeout=TIMEOUT)
        assert wait_for(
            lambda t=text, r=rank: f"{t} from rank {r}" in fresh_procs2.logs(rank=r, tail=5), every=0.05
        )
        said.append(f"[rank {rank}] {text} from rank {rank}")
    lines = [ln for ln in fresh_procs2.logs(tail=100, labelled=True) if " turn " in ln]
    assert lines == said  # not rank by rank
    _printed_here(capfd, [f"turn {i} from rank {r}" for i, r in enumerate([1, 0, 1, 0])])


def test_stream_logs_gives_new_lines_of_one_rank_as_they_come(fresh_procs2, capfd):
    mesh = fresh_procs2.spawn("speaker", Speaker)
    stream = fresh_procs2.stream_logs(rank=0)
    lines: list[str] = []
    arrived = threading.Event()

    def follow() -> None:
        try:
            for line in stream:
                lines.append(line)
                if "ping" in line:
                    arrived.set()
                    break
        finally:
            stream.close()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    # The stream may start after the first lines: speak until one arrives.
    deadline = time.monotonic() + WITHIN
    i = 0
    while not arrived.is_set() and time.monotonic() < deadline:
        mesh.say.call(f"ping {i}").get(timeout=TIMEOUT)
        i += 1
        arrived.wait(0.2)
    assert arrived.is_set(), f"no line came; got {lines}"
    follower.join(TIMEOUT)
    assert not follower.is_alive()
    ours = [ln for ln in lines if "ping" in ln]
    assert len(ours) == 1
    assert ours[0].startswith(f"[{fresh_procs2.name} 0] ping ")
    assert ours[0].endswith(" from rank 0")
    assert not any("from rank 1" in ln for ln in lines)
    _printed_here(capfd, [f"ping {i - 1} from rank 1"])


def _busy_notebook(request: Any) -> tuple[threading.Event, list[str], list[str]]:
    """This test's frontend: a notebook too busy to take output, whose sink waits
    for ``gate`` before it takes each line (into ``shown``); its notices go to
    ``notices``. The frontend before comes back after the test."""
    from monarch_kernel import controller

    gate, notices, shown = threading.Event(), [], []

    def busy_sink(session: Any, line: Any) -> None:
        gate.wait(WITHIN)
        shown.append(line.text)

    before = controller.frontend()
    controller.set_frontend(controller.Frontend(on_line=busy_sink, on_notice=notices.append))
    request.addfinalizer(lambda: controller.set_frontend(before))
    return gate, notices, shown


def test_a_controller_briefly_behind_on_short_lines_keeps_its_stream_and_every_line(fresh_procs2, request):
    # Thousands of one-line frames wait unread while the notebook is busy: HTTP/2's
    # guard against floods of small frames must not end the agent's connection (it
    # did: the lines then in flight were lost, and the cell's flush waited in vain).
    gate, notices, shown = _busy_notebook(request)
    mesh = fresh_procs2.spawn("speaker", Speaker)
    mesh.slice(procs=0).chat.call_one(3000).get(timeout=TIMEOUT)
    time.sleep(0.5)  # (the agent sends what the window lets through, then waits)
    gate.set()
    ours = lambda: [t for t in shown if t.startswith("c ")]  # noqa: E731
    assert wait_for(lambda: len(ours()) >= 3000), f"{len(ours())} of 3000 lines came"
    assert ours() == [f"c {i}" for i in range(3000)]
    assert not notices, notices


def test_a_controller_that_falls_behind_is_told_how_many_lines_it_missed(fresh_procs2, request):
    gate, notices, shown = _busy_notebook(request)
    mesh = fresh_procs2.spawn("speaker", Speaker)
    mesh.slice(procs=0).flood.call_one(120_000).get(timeout=TIMEOUT)  # more than the agent keeps
    gate.set()
    assert wait_for(lambda: notices), f"no notice; {len(shown)} lines shown"
    said = re.search(r"(\d+) lines of worker output were not shown", notices[0])
    assert said and int(said.group(1)) > 0, notices
    assert "%mesh logs" in notices[0]
    # Every line is still in the log file.
    assert wait_for(lambda: fresh_procs2.logs(rank=0, tail=1)[0].endswith(" flood 119999"), every=0.2)
    assert mesh.say.call("after").get(timeout=TIMEOUT) is not None  # the mesh goes on


def test_a_plain_script_prints_worker_output_with_mesh_and_rank(state_home):
    script = textwrap.dedent(
        """
        import sys
        import time
        from monarch_kernel import Actor, current_rank, endpoint, this_host

        class Greeter(Actor):
            @endpoint
            def greet(self):
                if current_rank()["procs"] == 1:
                    print("worker says hi", flush=True)
                return current_rank()["procs"]

        procs = this_host().spawn_procs(per_host={"procs": 2})
        try:
            print("mesh", procs.name, flush=True)
            ranks = procs.spawn("greeter", Greeter).greet.call().get(timeout=30).values()
            print("ranks", ranks, file=sys.stderr, flush=True)  # not interleaved with forwarded lines
            time.sleep(1.0)
        finally:
            procs.stop()
        """
    )
    done, out, name = _run_script(script)
    assert name.startswith("anon-")
    assert "ranks [0, 1]" in done.stderr
    assert f"[{name} 1] worker says hi" in out, done.stdout
    assert not any(ln.startswith(f"[{name} 0]") and "worker says hi" in ln for ln in out)


def test_a_script_with_a_logging_window_shows_identical_lines_once_with_their_ranks(state_home):
    # logging_option(aggregate_window_sec=...), as Monarch's getting-started uses it:
    # the same line from four ranks shows once, with the ranks and a count; a line of
    # one rank shows with its rank; none is lost when the mesh stops within the window.
    script = textwrap.dedent(
        """
        from monarch_kernel import Actor, current_rank, endpoint, this_host

        class Trainer(Actor):
            @endpoint
            def step(self):
                print("loss 0.31", flush=True)
                if current_rank()["procs"] == 2:
                    print("rank two is special", flush=True)

        procs = this_host().spawn_procs(per_host={"procs": 4})
        try:
            print("mesh", procs.name, flush=True)
            procs.logging_option(stream_to_client=True, aggregate_window_sec=0.5)
            procs.spawn("trainer", Trainer).step.call().get(timeout=30)
            procs.spawn("late", Trainer).step.call().get(timeout=30)
        finally:
            procs.stop()  # within the window: what it holds is shown now
        """
    )
    done, out, name = _run_script(script)
    merged = [ln for ln in out if "loss 0.31" in ln]
    assert merged and all(ln.startswith(f"[{name} ranks 0-3] [") for ln in merged), done.stdout
    assert sum(_count(ln) for ln in merged) == 8, done.stdout  # 2 calls x 4 ranks
    special = [ln for ln in out if "rank two is special" in ln]
    assert all(ln.startswith(f"[{name} 2] ") for ln in special), done.stdout  # one rank: its own label
    assert sum(_count(ln) for ln in special) == 2, done.stdout


def _run_script(script: str) -> tuple[subprocess.CompletedProcess[str], list[str], str]:
    """Runs ``script`` (which prints ``mesh NAME`` first) as a plain script that
    forwards its workers' output: how it ended, its stdout lines, its mesh's name."""
    env = dict(os.environ)
    env.pop("MONARCH_FORWARD_OUTPUT", None)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    return done, out, next(ln.split()[1] for ln in out if ln.startswith("mesh "))


def _count(line: str) -> int:
    """How many lines a shown line stands for (``[N similar log lines]``, else 1)."""
    rest = line.split("] ", 1)[1]
    return int(rest[1:].split()[0]) if rest.startswith("[") and "similar log lines]" in rest else 1
