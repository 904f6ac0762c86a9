"""The monarch kernel driven through jupyter_client: the stop button reaching the
workers, failures while idle, stacks, progress, remote pdb and input(), the
inspector widget."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from kernel_harness import TALKER, TIMEOUT, Kernel, Outcome
from proc_helpers import sigstop, still_alive

from monarch_kernel import controller
from monarch_kernel.hosts import _admin, _local


@pytest.fixture(scope="module", autouse=True)
def definitions(kernel: Kernel, mesh: str) -> None:
    out = kernel.run(TALKER)
    assert out.error is None, out.traceback


def test_the_stop_button_interrupts_a_mesh_cell_on_every_worker(kernel, mesh):
    out = kernel.run(
        "%%mesh\nimport time\ninterrupted = False\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
        "    interrupted = True\n    raise",
        wait=False,
    )
    time.sleep(1.5)
    t = time.monotonic()
    kernel.km.interrupt_kernel()
    kernel.collect(out)
    took = time.monotonic() - t
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    # One line, as for a local interrupt, saying where and that the remote code stopped;
    # not a traceback through the kernel's own code.
    assert out.error["traceback"] == [
        f"KeyboardInterrupt: %%mesh cell interrupted on ranks 0, 1 of mesh {mesh!r}; the remote code stopped"
    ], out.error["traceback"]
    assert took < 30  # sanity only: the figure goes in the closing note, not an assert
    check = kernel.run("%%mesh\ninterrupted")
    assert check.error is None, check.traceback
    assert sorted(text for _t, text, _d in check.displays)[-2:] == [
        "[rank 0]\nOut: True",
        "[rank 1]\nOut: True",
    ]


@pytest.mark.slow
def test_a_second_stop_while_idle_ends_a_worker_that_ignored_the_first(kernel, mesh):
    up = kernel.run("stubborn = %mesh up stubborn --procs 2")
    assert up.error is None, up.traceback
    try:
        out = kernel.run(
            "%%mesh\nimport time\nwhile True:\n    try:\n        time.sleep(60)\n"
            "    except KeyboardInterrupt:\n        print('not stopping', flush=True)",
            wait=False,
        )
        time.sleep(1.5)
        kernel.km.interrupt_kernel()  # the cell ends; the worker swallows it and goes on
        kernel.collect(out)
        assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
        time.sleep(2.0)  # one interrupt never kills, however many ranks it reached
        assert "['alive', 'alive']" in kernel.run("print(stubborn.status())").stdout
        kernel.km.interrupt_kernel()  # the kernel is idle: a second stop escalates
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            status = kernel.run("print(stubborn.status())").stdout
            if "['dead', 'dead']" in status:
                break
            time.sleep(0.3)
        assert "['dead', 'dead']" in status, status
        logs = kernel.run("print(stubborn.logs(rank=0, tail=5))").stdout
        assert "interrupted twice" in logs
    finally:
        kernel.run(f"%mesh down stubborn\n%mesh use {mesh}")


def test_the_stop_button_interrupts_a_blocking_get_on_the_workers(kernel, mesh):
    define = kernel.run(
        "class Spinner(Actor):\n"
        "    def __init__(self):\n"
        "        self.stopped_by = None\n"
        "    @endpoint\n"
        "    def spin(self):\n"
        "        try:\n"
        "            while True:\n"
        "                time.sleep(0.01)\n"
        "        except KeyboardInterrupt as e:\n"
        "            self.stopped_by = type(e).__name__\n"
        "            raise\n"
        "    @endpoint\n"
        "    def why(self):\n"
        "        return self.stopped_by\n"
        "spinner = procs.spawn('spinner', Spinner)"
    )
    assert define.error is None, define.traceback
    out = kernel.run("first = 1\nspinner.spin.call().get()", wait=False)
    time.sleep(1.5)
    kernel.km.interrupt_kernel()
    kernel.collect(out)
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    # The user's own line and what stopped, not monarch's wait machinery.
    tb = "\n".join(out.error["traceback"])
    assert "spinner.spin.call().get()" in tb and "monarch_kernel/" not in tb, tb
    assert out.error["traceback"][-1] == (
        f"KeyboardInterrupt: interrupted; the remote calls stopped: rank 0 of mesh {mesh!r} "
        f"(spinner.spin), rank 1 of mesh {mesh!r} (spinner.spin)"
    ), tb
    why = kernel.run("sorted(spinner.why.call().get().values())")
    assert why.result == "['KeyboardInterrupt', 'KeyboardInterrupt']"


def test_a_worker_that_dies_while_idle_is_reported_in_the_next_cell(kernel, mesh):
    out = kernel.run("[w['pid'] for w in procs._session('t').client.list_workers() if w['rank'] == 1][0]")
    victim = int(out.result or "0")
    os.kill(victim, signal.SIGKILL)
    assert not still_alive([victim])
    time.sleep(1.0)  # the kernel is idle meanwhile
    nxt = kernel.run("'next'")
    assert "rank 1" in nxt.stderr and "SIGKILL" in nxt.stderr, nxt.stderr
    assert f"pid {victim}" in nxt.stderr
    assert kernel.run("procs.respawn()").result == "[1]"
    assert kernel.run("%mesh status").stdout.count("alive") == 2


@pytest.mark.slow
def test_a_worker_stopped_while_idle_is_reported_and_answers_the_first_call_after_sigcont(kernel, mesh):
    define = kernel.run(
        "talkers = procs.spawn('talkers_sigstop', Talker)\ntalkers.say.call('warm').get().values()"
    )
    assert define.error is None, define.traceback
    out = kernel.run("[w['pid'] for w in procs._session('t').client.list_workers() if w['rank'] == 1][0]")
    victim = int(out.result or "0")
    sigstop(victim)
    try:
        time.sleep(6.0)  # the kernel is idle; the connection's keepalive gives up meanwhile
        nxt = kernel.run("'next'")
        assert "rank 1" in nxt.stderr and "unresponsive" in nxt.stderr, nxt.stderr
        assert "SIGSTOP" in nxt.stderr, nxt.stderr
    finally:
        os.kill(victim, signal.SIGCONT)
    first = kernel.run("talkers.say.call('back').get().values()")  # no wait for the heartbeat
    assert first.error is None, first.traceback
    assert first.result == "['back', 'back']"


def test_mesh_stacks_shows_what_a_busy_worker_is_running(kernel, mesh):
    busy = kernel.run(
        "%%mesh --noblock --ranks 0\nimport time\ndef crunch_numbers_for_a_while():\n"
        "    end = time.time() + 4\n    while time.time() < end:\n        sum(range(1000))\n"
        "crunch_numbers_for_a_while()"
    )
    assert busy.error is None, busy.traceback
    time.sleep(1.0)
    out = kernel.run("%mesh stacks --rank 0")
    assert out.error is None, out.traceback
    assert "=== rank 0 ===" in out.stdout
    assert "crunch_numbers_for_a_while" in out.stdout and "Thread MainThread" in out.stdout
    both = kernel.run("%mesh stacks").stdout
    assert "=== rank 1 ===" in both and "monarch-dispatch" not in both  # the answering thread is left out
    assert kernel.run("_mesh_run.wait(30)").error is None


@pytest.mark.slow
def test_long_waits_show_a_progress_bar_and_short_ones_nothing(kernel, mesh):
    assert kernel.run("talker = procs.spawn('talker', Talker)").error is None
    quick = kernel.run("talker.say.call('quick').get()")
    assert not any("<progress" in h for h in quick.html)
    slow = kernel.run("talker.say.call('slow', delay=2.5).get()")
    assert slow.error is None, slow.traceback
    bars = [h for h in slow.html if "<progress" in h]
    assert bars and "call(s)" in bars[0]
    assert slow.html[-1] == ""  # the bar is removed at the end
    cell = kernel.run("%%mesh\nimport time\ntime.sleep(2.5)")
    assert any("<progress" in h and "%%mesh on" in h for h in cell.html)


def test_a_mesh_of_many_procs_shows_how_many_have_started(kernel, mesh):
    # 48 procs take about a second to start: on a quick moment of an idle machine, less
    # than the second after which a start shows progress. A tenth of a second here.
    quick = "from monarch_kernel.controller import _lifecycle\n_lifecycle.PROGRESS_AFTER_S = {}"
    before = kernel.run("from monarch_kernel.controller import _lifecycle\n_lifecycle.PROGRESS_AFTER_S")
    assert before.result is not None
    assert kernel.run(quick.format(0.1)).error is None
    up = kernel.run("%mesh up many --procs 48")
    assert kernel.run(quick.format(before.result)).error is None
    try:
        assert up.error is None, up.traceback
        bars = [h for h in up.html if "<progress" in h]
        assert bars, up.html
        assert "starting mesh &#x27;many&#x27;, procs started" in bars[0]
        assert "max='48'" in bars[0]
        assert "" in up.html[up.html.index(bars[-1]) :]  # removed once they all have
    finally:
        assert kernel.run(f"%mesh down many\n%mesh use {mesh}").error is None


@pytest.mark.slow
def test_a_cell_waiting_behind_a_busy_rank_says_which_call_it_waits_for(kernel, mesh):
    assert kernel.run("blocker = procs.spawn('blocker', Talker)").error is None
    busy = kernel.run("pending = blocker.slice(procs=0).say.call_one('long', delay=6)")
    assert busy.error is None, busy.traceback
    out = kernel.run("blocker.slice(procs=0).say.call_one('next').get(timeout=4)")
    assert out.error is not None and out.error["ename"] == "TimeoutError"
    assert f"rank 0 of mesh {mesh!r} is busy with blocker.say" in out.stderr, out.stderr
    assert "%mesh stacks" in out.stderr
    assert kernel.run("pending.get(timeout=30)").error is None


def _answer_pdb(kernel: Kernel, out: Outcome, answers: list[str]) -> list[str]:
    """Answers the input requests of a running cell with ``answers``; returns the prompts."""
    prompts = []
    for line in answers:
        msg = kernel.kc.get_stdin_msg(timeout=TIMEOUT)
        assert msg["msg_type"] == "input_request"
        prompts.append(msg["content"]["prompt"])
        kernel.kc.input(line)
    return prompts


def test_breakpoint_in_an_endpoint_opens_pdb_in_the_calling_cell(kernel, mesh):
    define = kernel.run(
        "from monarch_kernel import Actor, endpoint\n"
        "class Dbg(Actor):\n"
        "    @endpoint\n"
        "    def f(self, x):\n"
        "        y = x * 2\n"
        "        breakpoint()\n"
        "        return y + 1\n"
        "dbg = procs.slice(procs=0).spawn('dbg', Dbg)"
    )
    assert define.error is None, define.traceback
    msg_id = kernel.kc.execute("dbg.f.call_one(20).get()", allow_stdin=True)
    out = Outcome(msg_id)
    prompts = _answer_pdb(kernel, out, ["p y", "n", "c"])
    kernel.collect(out)
    assert out.error is None, out.traceback
    assert all(p == f"[{mesh} 0] (Pdb) " for p in prompts)
    assert out.result == "41"
    assert "40" in out.stdout  # p y, shown in this cell
    assert "return y + 1" in out.stdout  # pdb's listing of where it stopped


def test_pdb_steps_into_a_function_lists_its_source_and_goes_on(kernel, mesh):
    define = kernel.run(
        "from monarch_kernel import Actor, endpoint\n"
        "def helper(v):\n"
        "    w = v + 5\n"
        "    return w * 2\n"
        "class Stepper(Actor):\n"
        "    @endpoint\n"
        "    def g(self, x):\n"
        "        breakpoint()\n"
        "        z = helper(x)\n"
        "        return z\n"
        "stepper = procs.slice(procs=1).spawn('stepper', Stepper)"
    )
    assert define.error is None, define.traceback
    out = Outcome(kernel.kc.execute("stepper.g.call_one(1).get()", allow_stdin=True))
    prompts = _answer_pdb(kernel, out, ["s", "s", "p v * 1000", "l", "n", "p w", "c"])
    kernel.collect(out)
    assert out.error is None, out.traceback
    assert all(p == f"[{mesh} 1] (Pdb) " for p in prompts)
    assert out.result == "12"
    assert "--Call--" in out.stdout and "helper(v)" in out.stdout  # s went into helper
    assert "1000" in out.stdout  # p v * 1000, inside helper
    assert "->     w = v + 5" in out.stdout or "w = v + 5" in out.stdout  # l listed the source
    assert "return w * 2" in out.stdout
    assert f"[{mesh} 1] 6\n" in out.stdout  # p w after n


def test_breakpoint_in_a_mesh_cell_asks_each_rank_in_turn(kernel, mesh):
    msg_id = kernel.kc.execute(
        "%%mesh\nimport os\nr = int(os.environ['MONARCH_RANK'])\nbreakpoint()\nr * 3", allow_stdin=True
    )
    out = Outcome(msg_id)
    prompts: list[str] = []
    asked: set[str] = set()
    for _ in range(4):  # each rank: print, then continue; either rank may come first
        prompt = kernel.kc.get_stdin_msg(timeout=TIMEOUT)["content"]["prompt"]
        prompts.append(prompt)
        if prompt in asked:  # what `p` printed shows before the rank asks again
            rank = int(prompt.split("]")[0].split()[-1])
            kernel.peek(out, 0.5)
            shown = [t for _k, t, _d in out.displays if t.startswith(f"[rank {rank}]")]
            assert shown and shown[-1].splitlines()[-1] == str(100 + rank), shown
        kernel.kc.input("c" if prompt in asked else "p r + 100")
        asked.add(prompt)
    kernel.collect(out)
    assert out.error is None, out.traceback
    assert sorted(set(prompts)) == [f"[{mesh} 0] (Pdb) ", f"[{mesh} 1] (Pdb) "]
    assert prompts[0] == prompts[1] and prompts[2] == prompts[3]  # one rank, then the other
    final = {d: t for _k, t, d in out.displays}  # each rank's block as it ended
    by_rank = {t.split("\n", 1)[0]: t for t in final.values()}
    assert "\n100\n" in by_rank["[rank 0]"] and "Out: 0" in by_rank["[rank 0]"]
    assert "\n101\n" in by_rank["[rank 1]"] and "Out: 3" in by_rank["[rank 1]"]


def test_pdb_in_a_mesh_cell_stops_on_its_last_expression(kernel, mesh):
    out = Outcome(kernel.kc.execute("%%mesh --ranks 0\nx = 5\nbreakpoint()\nx * 2", allow_stdin=True))
    _answer_pdb(kernel, out, ["n", "p x + 100", "c"])
    kernel.collect(out)
    assert out.error is None, out.traceback
    text = "\n".join(t for _k, t, _d in out.displays if t.startswith("[rank 0]"))
    # pdb stops on the last line, in the cell's own frame, as in a script; `n` runs it
    # and the cell returns (a separate eval used to stop at --Return-- of breakpoint()
    # and then inside the worker's code, where the cell's names were not defined).
    # (line 4: the editor's numbering, where the %%mesh line is line 1; TB-1)
    assert text.index("(4)<module>()\n-> x * 2") < text.index("--Return--"), text
    assert "_spmd.py" not in text and "NameError" not in text, text
    assert "105" in text and "Out: 10" in text


def test_input_in_a_mesh_cell_asks_the_notebook(kernel, mesh):
    out = Outcome(
        kernel.kc.execute("%%mesh --ranks 1\nname = input('your name? ')\nname.upper()", allow_stdin=True)
    )
    prompts = _answer_pdb(kernel, out, ["ada"])
    kernel.collect(out)
    assert out.error is None, out.traceback
    assert prompts == [f"[{mesh} 1] your name? "]
    assert "Out: 'ADA'" in "".join(t for _k, t, _d in out.displays)


def test_post_mortem_and_parked_breakpoints(kernel, mesh):
    failed = kernel.run(
        "%%mesh --ranks 1\nsecret = 'found me'\ndef boom():\n    local = 41\n    raise KeyError(local)\nboom()"
    )
    assert failed.error is not None or failed.reply.get("status") == "error"
    msg_id = kernel.kc.execute("%mesh debug --post-mortem 1", allow_stdin=True)
    out = Outcome(msg_id)
    prompts = _answer_pdb(kernel, out, ["p local + 1", "q"])
    kernel.collect(out)
    assert prompts[0] == f"[{mesh} 1] (Pdb) "
    assert "42" in out.stdout and "boom" in out.stdout
    # A breakpoint hit by a call nobody waits for (fire and forget) is parked, then
    # listed and attached to.
    define = kernel.run(
        "from monarch_kernel import Actor, endpoint\n"
        "class Parker(Actor):\n"
        "    @endpoint\n"
        "    def park(self):\n"
        "        here = 'parked'\n"
        "        breakpoint()\n"
        "parker = procs.slice(procs=0).spawn('parker', Parker)\n"
        "parker.park.broadcast()"
    )
    assert define.error is None, define.traceback
    time.sleep(1.5)
    listed = kernel.run("%mesh debug")
    assert f"[{mesh} 0] waiting in pdb" in listed.stdout
    msg_id = kernel.kc.execute("%mesh debug --rank 0", allow_stdin=True)
    out = Outcome(msg_id)
    _answer_pdb(kernel, out, ["p here", "c"])
    kernel.collect(out)
    assert "parked" in out.stdout
    assert "no rank is waiting" in kernel.run("%mesh debug").stdout


def test_one_pdb_command_reaches_many_parked_ranks(kernel, mesh):
    # DEBUG-3: Monarch's cast, from the notebook: both ranks parked at breakpoint()
    # (a call nobody waits for), one command continues them all.
    define = kernel.run(
        "from monarch_kernel import Actor, endpoint\n"
        "class Stopper(Actor):\n"
        "    @endpoint\n"
        "    def stop_here(self):\n"
        "        breakpoint()\n"
        "        print('went on')\n"
        "stoppers = procs.spawn('stoppers', Stopper)\n"
        "stoppers.stop_here.broadcast()"
    )
    assert define.error is None, define.traceback
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        listed = kernel.run("%mesh debug").stdout
        if f"[{mesh} 0] waiting" in listed and f"[{mesh} 1] waiting" in listed:
            break
        time.sleep(0.2)
    assert f"[{mesh} 0] waiting" in listed and f"[{mesh} 1] waiting" in listed, listed
    sent = kernel.run("%mesh debug --ranks 0-1 --cmd c")
    assert sent.error is None, sent.traceback
    assert f"[{mesh} 0] c" in sent.stdout and f"[{mesh} 1] c" in sent.stdout, sent.stdout
    shown = sent.stdout + kernel.run("import time; time.sleep(1.5)").stdout  # (ROUTE-4: the running cell's)
    assert shown.count("went on") == 2, shown
    assert "no rank is waiting" in kernel.run("%mesh debug").stdout
    assert "none of them waits" in kernel.run("%mesh debug --cmd c").stdout


def _widget_states(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The widget states sent in comm_open and comm_msg updates, in order."""
    out = []
    for m in msgs:
        if m["msg_type"] == "comm_open":
            out.append(m["content"]["data"].get("state", {}))
        elif m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "update":
            out.append(m["content"]["data"].get("state", {}))
    return out


def test_the_inspector_widget_shows_the_procs_and_follows_a_death(kernel, mesh):
    out = kernel.run("%mesh status")
    assert out.error is None, out.traceback
    opened = [m for m in out.raw if m["msg_type"] == "comm_open"]
    assert any(m["content"]["target_name"] == "jupyter.widget" for m in opened)
    procs_states = [s["procs"] for s in _widget_states(out.raw) if "procs" in s]
    assert procs_states and [p["state"] for p in procs_states[-1]] == ["alive", "alive"]
    assert all(p["pid"] > 0 for p in procs_states[-1])
    victim = procs_states[-1][1]["pid"]
    os.kill(victim, signal.SIGKILL)
    # The background thread sends updates while the kernel is idle.
    deadline, seen = time.monotonic() + 15, []
    while time.monotonic() < deadline:
        msg = kernel.kc.get_iopub_msg(timeout=15)
        for s in _widget_states([msg]):
            if "procs" in s:
                seen = [p["state"] for p in s["procs"]]
        if seen[1:2] == ["dead"]:
            break
    assert seen[1:2] == ["dead"], seen
    assert "procs.respawn" not in str(seen)
    # VIEW-1: the Meshes panel's picture, read here as an administrator, agrees.
    view = controller.view_of(mesh)
    assert view is not None and [r["state"] for r in view["ranks"]] == seen
    # OWNER-1: the agents know which kernel holds the mesh.
    owner = _admin.mesh_info(mesh).owner
    assert owner["kind"] == "kernel" and owner["pid"] == kernel.km.provisioner.pid
    assert owner["kernel_id"] == os.path.basename(kernel.km.connection_file).removesuffix(".json")
    out = kernel.run(f"%mesh respawn {mesh}")
    assert out.error is None, out.traceback
    assert out.result == "[1]" and f"mesh '{mesh}': restarted rank(s) [1]" in out.stdout
    assert kernel.run(f"%mesh respawn {mesh}").result == "[]"


def test_a_rank_that_displays_asks_and_fails_an_actor_leaves_only_its_printed_text_in_its_logs(kernel, mesh):
    """Typed worker events: the agent reads a control line's mark once; the display
    reaches the cell, the question the notebook, the actor's failure the controller,
    and none of them ``%mesh logs`` (the Logs tab's source too) or ``rank-N.log``."""
    out = Outcome(
        kernel.kc.execute(
            "%%mesh --ranks 0\nfrom IPython.display import HTML, display\nprint('typed: before')\n"
            "display(HTML('<b>typed: shown</b>'))\nanswer = input('typed: asked? ')\nprint('typed: got', answer)",
            allow_stdin=True,
        )
    )
    assert _answer_pdb(kernel, out, ["yes"]) == [f"[{mesh} 0] typed: asked? "]
    kernel.collect(out)
    assert out.error is None, out.traceback
    assert any("<b>typed: shown</b>" in h for h in out.html), out.html
    assert "typed: got yes" in "".join(t for _k, t, _d in out.displays)
    failing = kernel.run(
        "from monarch_kernel import context\n"
        "class Quitter(Actor):\n"
        "    @endpoint\n"
        "    def go(self):\n"
        "        print('typed: quitting', flush=True)\n"
        "        context().actor_instance.abort('typed: it chose to')\n"
        "quitter = procs.slice(procs=0).spawn('typed_quitter', Quitter)\n"
        "for _ in range(2):  # (the actor ends once its message is done: the second call fails)\n"
        "    try:\n"
        "        quitter.go.call_one().get(timeout=30)\n"
        "    except Exception as e:\n"
        "        print(type(e).__name__)\n"
        "        break\n"
    )
    assert "SupervisionError" in failing.stdout, (failing.stdout, failing.stderr, failing.traceback)
    logs = kernel.run("%mesh logs --rank 0 -n 500").stdout
    files = list((_local.state_dir() / "logs").glob(f"{mesh}*/rank-0.log"))
    assert len(files) == 1, files
    for where, text in (("%mesh logs", logs), ("rank-0.log", files[0].read_text())):
        for printed in ("typed: before", "typed: got yes", "typed: quitting"):
            assert printed in text, (where, text)
        for control in ("\x1d", "monarch display", "monarch input", "monarch supervision", "typed: shown"):
            assert control not in text, (where, control, text)
        assert "typed: asked?" not in text.replace("input('typed: asked? ')", ""), (where, text)
