"""The monarch kernel driven through jupyter_client: magics, outputs in the right
cell, restart and reattach. (Interrupts and debugging: test_kernel_debugging.py.)"""

from __future__ import annotations

import time
import uuid

import pytest
from kernel_harness import TALKER, TIMEOUT, start, stop


def test_the_first_cell_names_the_running_meshes_and_the_kernel_says_who_it_is(jupyter_path):
    k = start()
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
        stop(k)


def test_a_first_cell_that_makes_a_mesh_gets_no_hint_to_make_one(jupyter_path, tmp_path):
    """KERNEL-1: with no mesh running, the first cell's line is a hint to run %mesh up;
    a first cell that runs a %mesh command already does."""
    k = start(env={"XDG_STATE_HOME": str(tmp_path)})  # a state of its own: no mesh runs
    try:
        first = k.run("%mesh ls")
        assert "no running meshes; create one with" not in first.stdout, first.stdout
    finally:
        stop(k)


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


@pytest.mark.slow
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


def test_merged_outputs_show_each_line_once_with_the_ranks_that_printed_it(kernel, mesh):
    """``merge`` (the default beyond 8 ranks): identical lines of many ranks are one
    line with their ranks; the k-th copy of a line merges with the others' k-th; each
    rank's own output is folded below the merged lines once the cell ends."""
    out = kernel.run(
        "%%mesh --group-outputs merge\nimport os\nprint('same')\nprint('mine', os.environ['MONARCH_RANK'])\n"
        "print('same')\n7"
    )
    assert out.error is None, out.traceback
    shown = [
        m["content"]["data"]
        for m in out.raw
        if m["msg_type"] in ("display_data", "update_display_data")
        and "<progress" not in m["content"]["data"].get("text/html", "")
    ]
    ids = {
        m["content"].get("transient", {}).get("display_id")
        for m in out.raw
        if m["msg_type"] in ("display_data", "update_display_data")
    }
    assert len(ids) == 1, "one display for the whole cell"
    lines = shown[-1]["text/plain"].splitlines()
    assert lines[0] == "[ranks 0-1] same"
    assert sorted(lines[1:3]) == ["[rank 0] mine 0", "[rank 1] mine 1"]
    assert lines[3:] == ["[ranks 0-1] same", "[ranks 0-1] Out: 7"]
    folded = shown[-1]["text/html"]
    assert "<details>" in folded and "<b>[rank 1]</b>\nsame\nmine 1\nsame\nOut: 7" in folded
    assert not out.stdout


def test_ranks_are_named_as_runs():
    from monarch_kernel._ranks import ranks_span
    from monarch_kernel.kernel._cells import output_mode

    assert ranks_span([3]) == "rank 3"
    assert ranks_span(range(1024)) == "ranks 0-1023"
    assert ranks_span([11, 0, 1, 2, 3, 8, 10]) == "ranks 0-3, 8, 10-11"
    assert [output_mode("auto", n) for n in (1, 8, 9, 1024)] == ["rank", "rank", "merge", "merge"]
    assert output_mode("order", 1024) == "order"


def test_merged_progress_lines_replace_their_ranks_last_one():
    from monarch_kernel.kernel._cells import _Merged

    m = _Merged([0, 1, 2], "merge")
    for r in (0, 1):
        m.add(("m", r, "stdout", "start"))
    for r in (0, 1, 2):
        m.add(("m", r, "stdout", "step 10%\r"))
    for r in (0, 1):
        m.add(("m", r, "stdout", "step 50%\r"))
    m.add(("m", 2, "stdout", "done"))
    assert m.merged_text().splitlines() == [
        "[ranks 0-1] start",
        "[rank 2] step 10%",
        "[ranks 0-1] step 50%",
        "[rank 2] done",
    ]
    m._clear(2)
    assert m.merged_text().splitlines() == ["[ranks 0-1] start", "[ranks 0-1] step 50%"]


def test_a_kernels_workers_have_the_ipython_shell_from_their_template_before_any_cell(kernel):
    """FORK-1: a notebook's controller runs cells, so its workers' template made their
    IPython shell once (shared pages) before forking them; a script's does not
    (tests/integration/test_processes.py)."""
    out = kernel.run(
        "import sys\n"
        "from monarch_kernel import Actor, endpoint, this_host\n"
        "class ShellSeen(Actor):\n"
        "    @endpoint\n"
        "    def seen(self):\n"
        "        shell = sys.modules.get('IPython.core.interactiveshell')\n"
        "        return shell is not None and shell.InteractiveShell.initialized()\n"
        "fresh = this_host().spawn_procs(per_host={'procs': 2})\n"
        "try:\n"
        "    print('seen', fresh.spawn('shell_seen', ShellSeen).seen.call().get().values())\n"
        "finally:\n"
        "    fresh.stop()\n"
    )
    assert out.error is None, out.traceback
    assert "seen [True, True]" in out.stdout, out.stdout + out.stderr


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
    define = kernel.run(TALKER + "talker = procs.spawn('talker', Talker)")
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


def test_a_logging_window_shows_a_calls_identical_lines_once_with_their_ranks(kernel, mesh):
    define = kernel.run(TALKER + "talker = procs.spawn('talker', Talker)")
    assert define.error is None, define.traceback
    try:
        assert kernel.run("procs.logging_option(aggregate_window_sec=0.3)").error is None
        out = kernel.run("talker.say.call('in step').get(); import time; time.sleep(2.5)")
        assert out.error is None, out.traceback
        assert f"[{mesh} ranks 0-1] [2 similar log lines] in step" in out.stdout, out.stdout
        assert out.stdout.count("in step") == 1
    finally:
        kernel.run("procs.logging_option(aggregate_window_sec=None)")


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
    assert "ranks 0 to 1" in usage("%mesh debug --post-mortem 5")  # (was a raw IndexError)
    assert "no mesh named 'nosuchmesh'" in usage("%mesh down nosuchmesh")  # (was reported as done)
    help_text = kernel.kc.inspect("%mesh", reply=True)["content"]
    assert help_text["found"] and "push NAME=EXPR" in help_text["data"]["text/plain"]
    assert "--torch-dist" in help_text["data"]["text/plain"]


def test_meshes_survive_a_kernel_restart_with_their_namespaces(jupyter_path):
    name = f"r-{uuid.uuid4().hex[:6]}"
    k = start()
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
        # `%mesh up NAME` with no size reattaches too, and says and shows what
        # `%mesh attach` and a new mesh do: the states, and the live inspector.
        again = k.run(f"%mesh up {name}")
        assert again.error is None, again.traceback
        assert f"attached to mesh '{name}' (epoch" in again.stdout and "2 procs: 2 alive" in again.stdout
        opened = [m for m in again.raw if m["msg_type"] == "comm_open"]
        assert any(m["content"]["target_name"] == "jupyter.widget" for m in opened), again.stdout
    finally:
        k.run(f"%mesh down {name}")
        stop(k)


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
        huge_n = kernel.run(f"%mesh logs {mesh} -n 99999999999999999999")
        assert "-n 99999999999999999999 is more than 4294967295" in huge_n.stderr, huge_n.stderr
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


def test_a_control_plane_error_shows_the_users_frame_and_the_message_not_monarchs_frames(kernel, mesh):
    assert kernel.run(TALKER + "chatty = procs.spawn('chatty', Talker)").error is None
    code = "import threading\nchatty.say.call(threading.Lock()).get()"  # a lock cannot be pickled
    out = kernel.run(code)
    assert out.error is not None and out.error["ename"] == "SerializationError", out.error
    tb = "\n".join(out.error["traceback"])
    assert "monarch_kernel/" not in tb, tb  # none of the library's frames
    assert "chatty.say.call(threading.Lock()).get()" in tb  # the user's own line
    assert "MONARCH_FULL_TRACEBACK=1" in tb
    assert len(out.error["traceback"]) <= 12, tb
    full = kernel.run("%env MONARCH_FULL_TRACEBACK=1\n" + code)
    try:
        assert "monarch_kernel/mesh/" in "\n".join(full.error["traceback"])  # one flag away
    finally:
        kernel.run("%env MONARCH_FULL_TRACEBACK=0")


@pytest.mark.slow
def test_mesh_activate_runs_the_following_cells_torch_code_on_the_mesh_until_deactivate(kernel, mesh):
    out = kernel.run(f"%mesh activate {mesh}")
    assert out.error is None and f"mesh '{mesh}' is active" in out.stdout, out.traceback
    made = kernel.run(
        "import torch, monarch_kernel as mk\nw = torch.ones(3) * (procs.rank_tensor('procs') + 1)\nw"
    )
    assert made.error is None, made.traceback
    assert (
        made.result is not None and "monarch_kernel.Tensor(shape=(3,)" in made.result and mesh in made.result
    )
    # The next cell still runs on the mesh; a fetched value prints as any tensor.
    summed = kernel.run("s = w.reduce('procs', 'sum')\nmk.inspect(s, procs=1)")
    assert summed.error is None, summed.traceback
    assert summed.result == "tensor([3., 3., 3.])"
    off = kernel.run("%mesh deactivate")
    assert off.error is None and "no longer active" in off.stdout
    local = kernel.run("type(torch.ones(1)).__name__")
    assert local.result == "'Tensor'" and "monarch" not in (local.result or "")
    again = kernel.run("%mesh deactivate")
    assert "UsageError" in again.stderr and "no mesh is active" in again.stderr, again.stderr
    shown = kernel.run("mk.show(w)")
    assert shown.error is None, shown.traceback
    html = "".join(shown.html)  # one row per rank: the values differ
    assert "rank 0</td>" in html and "tensor([1., 1., 1.])" in html and "tensor([2., 2., 2.])" in html, html


def test_a_client_that_reads_iopub_only_after_the_cell_ends_gets_every_worker_line(kernel, mesh):
    """ROUTE-5: the workers' lines that come as a cell's stream go as a few messages,
    not one each: iopub drops what exceeds its high-water mark (1,000 messages) for a
    client that does not read meanwhile, as a client on a busy machine does not."""
    n = 5000
    code = (
        "%%mesh\nimport threading\n"
        f"def bg():\n    for i in range({n}):\n        print('bg', i, 'end')\n"
        "t = threading.Thread(target=bg)\nt.start()\nt.join()"
    )
    out = kernel.run(code, wait=False)
    while True:  # the reply first: nothing is read from iopub while the cell runs
        reply = kernel.kc.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == out.msg_id:
            break
    while not kernel._take(out, kernel.kc.get_iopub_msg(timeout=120)):
        pass
    assert reply["content"]["status"] == "ok", reply["content"]
    for rank in (0, 1):
        bg = [ln for ln in out.stdout.splitlines() if ln.startswith(f"[{mesh} {rank}] ")]
        assert bg == [f"[{mesh} {rank}] bg {i} end" for i in range(n)], (len(bg), bg[:3])
