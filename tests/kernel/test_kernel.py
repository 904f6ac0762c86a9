"""The monarch kernel driven through jupyter_client: magics, outputs in the right
cell, interrupts that reach the workers, restart and reattach, idle failures."""

from __future__ import annotations

import os
import queue
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from jupyter_client.manager import KernelManager, start_new_kernel
from proc_helpers import still_alive

TIMEOUT = 60


@dataclass
class Outcome:
    """What one execute_request produced, from iopub messages with its parent."""

    msg_id: str
    streams: list[tuple[str, str]] = field(default_factory=list)
    displays: list[tuple[str, str, str | None]] = field(default_factory=list)  # (type, text, display_id)
    result: str | None = None
    error: dict[str, Any] | None = None
    others: list[dict[str, Any]] = field(default_factory=list)  # messages for other cells
    reply: dict[str, Any] = field(default_factory=dict)  # the execute_reply's content
    html: list[str] = field(default_factory=list)  # text/html of display messages
    raw: list[dict[str, Any]] = field(default_factory=list)  # every message of this cell

    @property
    def stdout(self) -> str:
        return "".join(t for n, t in self.streams if n == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(t for n, t in self.streams if n == "stderr")

    @property
    def traceback(self) -> str:
        return "\n".join(self.error["traceback"]) if self.error else ""


class Kernel:
    def __init__(self, km: KernelManager, kc: Any) -> None:
        self.km, self.kc = km, kc

    def run(self, code: str, timeout: float = TIMEOUT, wait: bool = True) -> Outcome:
        msg_id = self.kc.execute(code)
        out = Outcome(msg_id)
        if wait:
            self.collect(out, timeout)
        return out

    def _take(self, out: Outcome, msg: dict[str, Any]) -> bool:
        """Files one iopub message into ``out``; True at its cell's idle status."""
        t, c = msg["msg_type"], msg["content"]
        if msg["parent_header"].get("msg_id") != out.msg_id:
            out.others.append(msg)
            return False
        out.raw.append(msg)
        if t == "status" and c["execution_state"] == "idle":
            return True
        if t == "stream":
            out.streams.append((c["name"], c["text"]))
        elif t in ("display_data", "update_display_data"):
            out.html.append(c["data"].get("text/html", ""))
            if "text/html" not in c["data"]:  # progress bars (on a slow machine): kept apart
                out.displays.append(
                    (t, c["data"].get("text/plain", ""), c.get("transient", {}).get("display_id"))
                )
        elif t == "execute_result":
            out.result = c["data"].get("text/plain")
        elif t == "error":
            out.error = c
        return False

    def peek(self, out: Outcome, seconds: float = 0.5) -> Outcome:
        """Files what iopub brings for ``seconds`` into ``out`` (the cell still runs)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            assert not self._take(out, msg), "the cell ended while peeking"
        return out

    def collect(self, out: Outcome, timeout: float = TIMEOUT) -> Outcome:
        deadline = time.monotonic() + timeout
        while not self._take(out, self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))):
            pass
        while True:  # the matching execute_reply
            reply = self.kc.get_shell_msg(timeout=TIMEOUT)
            if reply["parent_header"].get("msg_id") == out.msg_id:
                out.reply = reply["content"]
                return out


def _start() -> Kernel:
    km, kc = start_new_kernel(kernel_name="monarch", startup_timeout=TIMEOUT)
    return Kernel(km, kc)


def _stop(k: Kernel) -> None:
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def kernel(jupyter_path: None) -> Iterator[Kernel]:
    k = _start()
    k.run("1")  # the start line
    yield k
    k.run("%mesh down --all")
    _stop(k)


@pytest.fixture(scope="module")
def mesh(kernel: Kernel) -> str:
    name = f"k-{uuid.uuid4().hex[:6]}"
    out = kernel.run(f"procs = %mesh up {name} --procs 2")
    assert out.error is None, out.traceback
    assert f"mesh '{name}' up: 2 procs" in out.stdout
    return name


def test_the_first_cell_names_the_running_meshes_and_the_kernel_says_who_it_is(jupyter_path):
    k = _start()
    try:
        first = k.run("1 + 1")
        assert (
            "monarch: no running meshes" in first.stdout or "running meshes you can attach to" in first.stdout
        )
        assert first.result == "2"
        assert "monarch" not in k.run("2 + 2").stdout  # once
        info = k.kc.kernel_info(reply=True)["content"]
        assert info["implementation"] == "monarch-kernel"
        assert info["language_info"]["name"] == "python"
    finally:
        _stop(k)


def test_mesh_cells_stream_one_block_per_rank_and_show_each_value(kernel, mesh):
    out = kernel.run(
        "%%mesh\nimport os\nprint('hello', os.environ['MONARCH_RANK'])\nint(os.environ['MONARCH_RANK']) * 10"
    )
    assert out.error is None, out.traceback
    final: dict[str, str] = {}
    for _type, text, display_id in out.displays:
        assert display_id, "per-rank blocks are updated in place"
        final[display_id] = text
    blocks = sorted(final.values())
    assert blocks == ["[rank 0]\nhello 0\nOut: 0", "[rank 1]\nhello 1\nOut: 10"]
    assert not out.stdout  # nothing leaked out of the blocks
    ranks = kernel.run(
        "%%mesh\nfrom monarch_kernel import current_rank, current_size\n(current_rank().rank, current_size())"
    )
    assert sorted({d: t for _k, t, d in ranks.displays}.values()) == [
        "[rank 0]\nOut: (0, {'procs': 2})",
        "[rank 1]\nOut: (1, {'procs': 2})",
    ]
    quiet = kernel.run("%%mesh\nx = 7\nx * 2;  # a trailing ; hides the value, as in IPython")
    assert quiet.error is None, quiet.traceback
    assert "Out:" not in "".join(t for _k, t, _d in quiet.displays)


def test_a_mesh_cell_that_prints_a_lot_keeps_every_line_and_sends_it_about_once(kernel, mesh):
    n = 30_000
    out = kernel.run(f"%%mesh\nfor i in range({n}):\n    print('line', i)", timeout=120)
    assert out.error is None, out.traceback
    final: dict[str, str] = {}  # each block as it ended, in the order the blocks began
    for _type, text, display_id in out.displays:
        final[display_id] = text
    for rank in (0, 1):
        blocks = [t for t in final.values() if t.startswith(f"[rank {rank}]")]
        assert len(blocks) > 1 and all(b.startswith(f"[rank {rank}] (continued)\n") for b in blocks[1:])
        lines = [ln for b in blocks for ln in b.split("\n")[1:]]
        assert lines == [f"line {i}" for i in range(n)]  # none lost, none twice, in order
    sent = sum(len(t) for _t, t, _d in out.displays)
    printed = 2 * sum(len(f"line {i}\n") for i in range(n))
    assert sent < 4 * printed, (sent, printed)  # a block is re-sent only while it is small


def test_a_mesh_cell_may_await_at_top_level_and_a_syntax_error_shows_only_the_cell(kernel, mesh):
    out = kernel.run("%%mesh\nimport asyncio\nawait asyncio.sleep(0.05)\nawait asyncio.sleep(0, 'awaited')")
    assert out.error is None, out.traceback
    texts = sorted({d: t for _k, t, d in out.displays}.values())
    assert texts == ["[rank 0]\nOut: 'awaited'", "[rank 1]\nOut: 'awaited'"]
    bad = kernel.run("%%mesh --ranks 0\nx = (1,\n")
    assert "SyntaxError" in bad.traceback
    assert "_spmd.py" not in bad.traceback and "_main_thread.py" not in bad.traceback, bad.traceback


def test_lines_printed_by_two_threads_of_a_mesh_cell_stay_whole_and_go_where_they_belong(kernel, mesh):
    out = kernel.run(
        "%%mesh\nimport threading\n"
        "def bg():\n    for i in range(3000):\n        print('bg', i, 'end')\n"
        "t = threading.Thread(target=bg)\nt.start()\n"
        "for i in range(3000):\n    print('fg', i, 'end')\nt.join()",
        timeout=120,
    )
    assert out.error is None, out.traceback
    final = {d: t for _k, t, d in out.displays}
    for rank in (0, 1):
        block = [ln for t in final.values() if t.startswith(f"[rank {rank}]") for ln in t.split("\n")[1:]]
        assert block == [f"fg {i} end" for i in range(3000)]  # the cell's own lines, whole
        # The thread has no call of its own: its lines come as the cell's stream, whole too.
        bg = [ln for ln in out.stdout.splitlines() if ln.startswith(f"[{mesh} {rank}] ")]
        assert bg == [f"[{mesh} {rank}] bg {i} end" for i in range(3000)], bg[:5]


def test_group_outputs_order_prefixes_lines_with_their_rank(kernel, mesh):
    out = kernel.run("%%mesh --group-outputs order --ranks 1\nprint('only me')")
    assert out.stdout == "[rank 1] only me\n"


def test_the_mesh_namespace_persists_and_push_and_pull_reach_it(kernel, mesh):
    assert kernel.run("%mesh push base=40+2").error is None
    out = kernel.run("%%mesh\ndoubled = base * 2")
    assert out.error is None, out.traceback
    pulled = kernel.run("%mesh pull doubled")
    assert pulled.result is not None and pulled.result.count("84") == 2
    missing = kernel.run("%mesh pull nope")
    assert missing.error is not None and "nope" in missing.traceback
    # Expressions keep their quotes, spaces and commas (train is a notebook variable).
    kernel.run("train = 5")
    pushed = kernel.run("%mesh push mode='train' cfg={'lr': 0.1, 'n': [1, 2]} path=\"/tmp/my file\"")
    assert pushed.error is None and not pushed.stderr, pushed.stderr + pushed.traceback
    seen = kernel.run("%%mesh --ranks 0\n(mode, cfg['n'], path)")
    assert "Out: ('train', [1, 2], '/tmp/my file')" in "".join(t for _k, t, _d in seen.displays)


def test_a_failing_mesh_cell_shows_each_ranks_remote_traceback_with_the_cells_lines(kernel, mesh):
    out = kernel.run(
        "%%mesh\nimport os\nx = 1\nif os.environ['MONARCH_RANK'] == '1':\n    raise ValueError('bad rank')"
    )
    assert out.error is not None
    tb = out.traceback
    assert "--- rank 1 ---" in tb and "--- rank 0 ---" not in tb
    assert "raise ValueError('bad rank')" in tb  # the cell's own source line
    assert "_main_thread.py" not in tb and "_spmd.py" not in tb
    assert "1 of 2 ranks failed" in tb
    # A function from an earlier %%mesh cell shows its own lines, not the later cell's.
    kernel.run("%%mesh --ranks 0\ndef helper(x):\n    y = x + 1\n    return 1 / (x - x)")
    later = kernel.run("%%mesh --ranks 0\na_variable = 5\nb_variable = 6\nc_variable = 7\nhelper(3)")
    assert "return 1 / (x - x)" in later.traceback, later.traceback
    assert "c_variable = 7" not in later.traceback


def test_what_an_endpoint_prints_shows_in_the_cell_that_called_it(kernel, mesh):
    define = kernel.run(
        "from monarch_kernel import Actor, endpoint\n"
        "import time\n"
        "class Talker(Actor):\n"
        "    @endpoint\n"
        "    def say(self, text, delay=0.0):\n"
        "        time.sleep(delay)\n"
        "        print(text, flush=True)\n"
        "        return text\n"
        "talker = procs.spawn('talker', Talker)"
    )
    assert define.error is None, define.traceback
    now = kernel.run("talker.say.call('right away').get()")
    assert "[" in now.stdout and "right away" in now.stdout
    assert now.stdout.count("right away") == 2  # both ranks, before the cell ended
    # A call whose output comes after its cell ended: front ends drop output sent to a
    # finished request, so it shows in the cell running then (ROUTE-4).
    first = kernel.run("pending = talker.say.call('later', delay=1.5)")
    second = kernel.run("import time; time.sleep(3); 'second'")
    assert "later" not in first.stdout
    assert second.stdout.count("later") == 2
    late = [m for m in second.others if m["msg_type"] == "stream" and "later" in m["content"]["text"]]
    assert not late  # nothing went to the first cell's request


def test_output_printed_while_the_kernel_is_idle_shows_in_the_next_cell(kernel, mesh):
    define = kernel.run(
        "from monarch_kernel import Actor, endpoint\n"
        "class Late(Actor):\n"
        "    @endpoint\n"
        "    def later(self, s, text):\n"
        "        import time\n"
        "        time.sleep(s)\n"
        "        print(text, flush=True)\n"
        "late = procs.slice(procs=0).spawn('late', Late)\n"
        "late.later.broadcast(1.0, 'printed while idle')"
    )
    assert define.error is None, define.traceback
    assert "printed while idle" not in define.stdout
    time.sleep(2.5)
    nxt = kernel.run("1")
    assert f"[{mesh} 0] printed while idle" in nxt.stdout  # kept for the next cell


def test_bad_magic_arguments_raise_usage_error_with_the_fix(kernel, mesh):
    # IPython shows a UsageError as one line on stderr, and the reply is an error.
    def usage(code: str) -> str:
        out = kernel.run(code)
        assert out.reply["status"] == "error" and out.reply["ename"] == "UsageError", out
        return out.stderr

    assert "up, attach, ls" in usage("%mesh frobnicate")
    assert "arguments are required: name" in usage("%mesh up")
    assert "--procs N" in usage("%mesh up nosuchmesh")
    assert "not both" in usage("%mesh up x --procs 1 --gpus 1")
    assert "KEY=VALUE" in usage("%mesh up x --procs 1 --env NOEQUALS")
    assert "--torch-dist must be one of gloo, nccl, auto" in usage("%mesh up x --procs 1 --torch-dist mpi")
    assert "ranks 0 to 1" in usage("%%mesh --ranks 5\n1")
    help_text = kernel.kc.inspect("%mesh", reply=True)["content"]
    assert help_text["found"] and "push NAME=EXPR" in help_text["data"]["text/plain"]
    assert "--torch-dist" in help_text["data"]["text/plain"]


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
    assert took < 30  # sanity only: the figure goes in the closing note, not an assert
    check = kernel.run("%%mesh\ninterrupted")
    assert check.error is None, check.traceback
    assert sorted(text for _t, text, _d in check.displays)[-2:] == [
        "[rank 0]\nOut: True",
        "[rank 1]\nOut: True",
    ]


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
    out = kernel.run("spinner.spin.call().get()", wait=False)
    time.sleep(1.5)
    kernel.km.interrupt_kernel()
    kernel.collect(out)
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
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


def test_meshes_survive_a_kernel_restart_with_their_namespaces(jupyter_path):
    name = f"r-{uuid.uuid4().hex[:6]}"
    k = _start()
    try:
        k.run("1")
        assert k.run(f"procs = %mesh up {name} --procs 2").error is None
        assert k.run("%%mesh\nsecret = 'kept'").error is None
        pids = k.run("sorted(w['pid'] for w in procs._session('t').client.list_workers())").result
        k.km.restart_kernel(now=True)
        k.kc.wait_for_ready(timeout=TIMEOUT)
        first = k.run("1")
        assert "running meshes you can attach to:" in first.stdout and f"{name} (2/2 procs)" in first.stdout
        attached = k.run(f"procs = %mesh attach {name}")
        assert attached.error is None, attached.traceback
        assert f"attached to mesh '{name}'" in attached.stdout
        assert k.run("sorted(w['pid'] for w in procs._session('t').client.list_workers())").result == pids
        out = k.run("%%mesh\nsecret")
        assert sorted(text for _t, text, _d in out.displays)[-2:] == [
            "[rank 0]\nOut: 'kept'",
            "[rank 1]\nOut: 'kept'",
        ]
    finally:
        k.run(f"%mesh down {name}")
        _stop(k)


def test_use_ls_slice_noblock_and_timeout(kernel, mesh):
    other = f"u-{uuid.uuid4().hex[:6]}"
    assert kernel.run(f"%mesh up {other} --procs 1").error is None
    try:
        listed = kernel.run("%mesh ls").stdout
        assert mesh in listed and other in listed and listed.startswith("NAME")
        # The last mesh brought up is the default; %mesh use switches back.
        one = kernel.run("%%mesh\nimport os\nint(os.environ['MONARCH_RANK'])")
        assert [t for _k, t, _d in one.displays] == ["[rank 0]\nOut: 0"]
        assert "default mesh" in kernel.run(f"%mesh use {mesh}").stdout
        sliced = kernel.run("%%mesh --slice procs=1\nimport os\nos.environ['MONARCH_RANK']")
        assert [t for _k, t, _d in sliced.displays] == ["[rank 1]\nOut: '1'"]
        named = kernel.run(f"%%mesh {other}\n'on the other mesh'")
        assert [t for _k, t, _d in named.displays] == ["[rank 0]\nOut: 'on the other mesh'"]
        started = kernel.run("%%mesh --noblock\nimport time\ntime.sleep(0.5)\n'late'")
        assert "_mesh_run.wait()" in started.stdout
        waited = kernel.run("sorted(_mesh_run.wait(30).values())")
        assert waited.result == "[\"'late'\", \"'late'\"]"
        slow = kernel.run("%%mesh --timeout 1\nimport time\ntime.sleep(30)")
        assert slow.error is not None and slow.error["ename"] == "TimeoutError"
        assert kernel.run("%%mesh\n'still usable'").error is None
        # Another size for a running name: the error names the flag that does it.
        resized = kernel.run(f"%mesh up {other} --procs 2")
        assert "Add --replace" in resized.stderr, resized.stderr  # a UsageError: on stderr
        assert "replace=True" not in resized.stderr
        assert "2 procs" in kernel.run(f"%mesh up {other} --procs 2 --replace").stdout
        assert kernel.run(f"%mesh use {mesh}").error is None
        # Bad ranks and counts for %mesh logs say what is wrong.
        bad_rank = kernel.run(f"%mesh logs {mesh} --rank 5")
        assert "rank 5 is out of range" in bad_rank.stderr and "0 to 1" in bad_rank.stderr, bad_rank.stderr
        bad_n = kernel.run(f"%mesh logs {mesh} -n -3")
        assert "-n -3 must be 0 or more" in bad_n.stderr, bad_n.stderr
    finally:
        kernel.run(f"%mesh down {other}")


def test_output_without_a_final_newline_is_shown_and_the_flush_marker_never_is(kernel, mesh):
    out = kernel.run("%%mesh --ranks 0\nimport sys\nsys.stdout.write('no newline at the end')")
    assert out.error is None, out.traceback
    texts = [t for _k, t, _d in out.displays]
    assert texts and "no newline at the end" in texts[-1]
    assert not any("monarch flush" in t for t in texts)
    logs = kernel.run("%mesh logs --rank 0 -n 50").stdout
    assert "no newline at the end" in logs and "monarch flush" not in logs


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
    assert text.index("(3)<module>()\n-> x * 2") < text.index("--Return--"), text
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
    kernel.run("'absorb the failure notice'")
    assert kernel.run("procs.respawn()").result == "[1]"
