"""``%%mesh`` cells that feel local (issue 17), through jupyter_client: output before
the value it preceded (CELL-1), ``\\r`` as a terminal shows it, tracebacks that name
``Cell In[n]`` with the editor's line numbers (TB-1)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _blocks(out) -> dict[str, str]:
    """The final text of each rank's block, by display id."""
    return {d: t for _kind, t, d in out.displays}


def test_what_a_rank_printed_before_returning_shows_before_its_value_on_a_loaded_machine(kernel, mesh):
    # CPU hogs on every core: the worker's output (through its agent) and its reply
    # (direct) race; the value must still come after the lines.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        for _ in range(5):
            out = kernel.run(
                "%%mesh\nfor i in range(20):\n    print('line', i)\nprint('last words')\n'the value'"
            )
            assert out.error is None, out.traceback
            for text in _blocks(out).values():
                assert text.index("last words") < text.index("Out: 'the value'"), text
                assert text.count("line ") == 20
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_carriage_returns_rewrite_the_ranks_last_line_as_a_terminal_would(kernel, mesh):
    out = kernel.run(
        "%%mesh\nimport time\n"
        "for i in range(40):\n    print(f'\\rstep {i}', end='', flush=True)\n    time.sleep(0.005)\n"
        "print()\nprint('after the bar')"
    )
    assert out.error is None, out.traceback
    for text in _blocks(out).values():
        assert "step 39" in text and "after the bar" in text
        assert text.count("step ") == 1, text  # one live line, not forty


def test_a_mesh_cell_traceback_names_cell_in_n_with_the_editors_line_numbers(kernel, mesh):
    out = kernel.run("%%mesh --ranks 0\nx = 1\ny = 2\nraise ValueError('third line of the body')")
    count = out.reply["execution_count"]
    # The %%mesh line is line 1, so the raise is line 4, as the editor numbers it.
    assert f"Cell In[{count}], line 4" in out.traceback, out.traceback
    assert "<%%mesh cell" not in out.traceback


def test_a_function_from_an_earlier_mesh_cell_names_its_own_cell_and_line(kernel, mesh):
    first = kernel.run("%%mesh --ranks 0\ndef explode(x):\n    return 1 / x")
    defined_in = first.reply["execution_count"]
    later = kernel.run("%%mesh --ranks 0\nexplode(0)")
    assert f"Cell In[{defined_in}], line 3" in later.traceback, later.traceback
    assert f"Cell In[{later.reply['execution_count']}], line 2" in later.traceback


@pytest.mark.parametrize("code", ["import sys; sys.exit(3)"])
def test_sys_exit_in_a_mesh_cell_is_an_error_of_that_cell_and_the_next_cell_runs(kernel, mesh, code):
    out = kernel.run(f"%%mesh\n{code}")
    assert "SystemExit: 3" in out.traceback
    again = kernel.run("%%mesh\n'still here'")
    assert again.error is None, again.traceback
    assert all("Out: 'still here'" in t for t in _blocks(again).values())


def _outputs(out) -> list[tuple[str, dict]]:
    """(message type, content) of the cell's display messages, in arrival order."""
    return [
        (m["msg_type"], m["content"])
        for m in out.raw
        if m["msg_type"] in ("display_data", "update_display_data", "execute_result")
    ]


def _plain(content: dict) -> str:
    return str(content.get("data", {}).get("text/plain", ""))


def test_display_in_a_mesh_cell_sends_its_mime_bundle_in_the_ranks_place(kernel, mesh):
    out = kernel.run(
        "%%mesh\nfrom IPython.display import display, HTML\n"
        "print('before')\ndisplay(HTML('<b>rich</b>'))\nprint('after')"
    )
    assert out.error is None, out.traceback
    outputs = _outputs(out)
    for rank in (0, 1):
        order = [
            i
            for i, (_t, c) in enumerate(outputs)
            if _plain(c).startswith(f"[rank {rank}]") or c.get("data", {}).get("text/html") == "<b>rich</b>"
        ]
        texts = [_plain(outputs[i][1]) for i in order]
        before = next(
            i
            for i in order
            if "before" in _plain(outputs[i][1]) and f"[rank {rank}]" in _plain(outputs[i][1])
        )
        after = next(
            i for i in order if "after" in _plain(outputs[i][1]) and f"[rank {rank}]" in _plain(outputs[i][1])
        )
        assert any(before < i < after and "text/html" in outputs[i][1]["data"] for i in order), texts
    assert sum(c.get("data", {}).get("text/html") == "<b>rich</b>" for _t, c in outputs) == 2


def test_a_matplotlib_figure_shown_on_a_worker_arrives_as_a_png(kernel, mesh):
    out = kernel.run("%%mesh --ranks 0\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    assert out.error is None, out.traceback
    pngs = [c for _t, c in _outputs(out) if "image/png" in c.get("data", {})]
    assert len(pngs) == 1
    import base64

    assert base64.b64decode(pngs[0]["data"]["image/png"]).startswith(b"\x89PNG")


def test_a_rich_value_shows_as_its_html_and_a_plain_one_as_out_text(kernel, mesh):
    out = kernel.run(
        "%%mesh --ranks 1\nclass Table:\n    def _repr_html_(self):\n        return '<table><tr><td>1</td></tr></table>'\n"
        "    def __repr__(self):\n        return 'Table()'\nTable()"
    )
    assert out.error is None, out.traceback
    assert any(c.get("data", {}).get("text/html", "").startswith("<table>") for _t, c in _outputs(out))
    plain = kernel.run("%%mesh --ranks 1\n40 + 2")
    assert any("Out: 42" in _plain(c) for _t, c in _outputs(plain))


def test_a_large_bundle_comes_whole_through_the_transfer_engine(kernel, mesh):
    out = kernel.run(
        "%%mesh --ranks 0\nfrom IPython.display import display, HTML\ndisplay(HTML('<p>' + 'x' * 300_000 + '</p>'))"
    )
    assert out.error is None, out.traceback
    html = [c["data"]["text/html"] for _t, c in _outputs(out) if "text/html" in c.get("data", {})]
    assert html == ["<p>" + "x" * 300_000 + "</p>"]


def test_update_display_and_clear_output_stay_within_the_rank(kernel, mesh):
    out = kernel.run(
        "%%mesh\nfrom IPython.display import display, update_display, clear_output, HTML\n"
        "import os\nprint('kept unless cleared')\n"
        "h = display(HTML('v1'), display_id=True)\nupdate_display(HTML('v2'), display_id=h.display_id)\n"
        "if os.environ['MONARCH_RANK'] == '1':\n    clear_output()\n    print('after clear')"
    )
    assert out.error is None, out.traceback
    outputs = _outputs(out)
    updates = [
        c for t, c in outputs if t == "update_display_data" and c.get("data", {}).get("text/html") == "v2"
    ]
    assert len(updates) == 2  # each rank updated its own display
    finals = {}
    for _t, c in outputs:
        if c.get("transient", {}).get("display_id"):
            finals[c["transient"]["display_id"]] = _plain(c)
    rank0 = [v for v in finals.values() if v.startswith("[rank 0]")]
    assert any("kept unless cleared" in v for v in rank0)  # rank 1's clear left rank 0 alone
    rank1 = [v for v in finals.values() if v.startswith("[rank 1]")]
    assert any("after clear" in v for v in rank1)
    assert not any("kept unless cleared" in v for v in rank1)


def test_what_an_endpoint_displays_shows_in_the_cell_that_called_it(kernel, mesh):
    define = kernel.run(
        "from monarch_kernel import Actor, endpoint\n"
        "class Shows(Actor):\n    @endpoint\n    def show(self):\n"
        "        from IPython.display import display, Markdown\n        display(Markdown('**from an endpoint**'))\n"
        "shows = procs.spawn('shows', Shows)"
    )
    assert define.error is None, define.traceback
    out = kernel.run("shows.show.call().get()")
    assert out.error is None, out.traceback
    md = [c for _t, c in _outputs(out) if c.get("data", {}).get("text/markdown") == "**from an endpoint**"]
    assert len(md) == 2


def test_a_widget_made_on_a_worker_renders_through_the_comm_bridge(kernel, mesh):
    # DISPLAY-2: the worker's widget model is opened with the front end by the kernel
    # (comm_open on iopub), and the widget's view refers to that model.
    out = kernel.run("%%mesh --ranks 0\nimport ipywidgets\nipywidgets.IntSlider(value=7)")
    assert out.error is None, out.traceback
    opened = {m["content"]["comm_id"]: m["content"] for m in out.raw if m["msg_type"] == "comm_open"}
    assert opened and all(c["target_name"] == "jupyter.widget" for c in opened.values())
    views = [
        c["data"]["application/vnd.jupyter.widget-view+json"]
        for _t, c in _outputs(out)
        if "application/vnd.jupyter.widget-view+json" in c.get("data", {})
    ]
    assert len(views) == 1 and views[0]["model_id"] in opened
    slider = next(c for c in opened.values() if c["data"]["state"].get("_model_name") == "IntSliderModel")
    assert slider["data"]["state"]["value"] == 7


def test_tqdm_auto_on_a_worker_takes_its_notebook_form_through_the_bridge(kernel, mesh):
    out = kernel.run(
        "%%mesh\nfrom tqdm.auto import tqdm\nimport time\n"
        "for _ in tqdm(range(20), mininterval=0):\n    time.sleep(0.005)\n"
        "'tqdm.notebook' in [c.__module__ for c in tqdm.__mro__]"
    )
    assert out.error is None, out.traceback
    models = [
        m["content"]["data"]["state"].get("_model_name") for m in out.raw if m["msg_type"] == "comm_open"
    ]
    assert models.count("FloatProgressModel") + models.count("IntProgressModel") == 2  # one bar per rank
    updates = [m for m in out.raw if m["msg_type"] == "comm_msg"]
    assert updates  # the bars moved
    values = [_plain(c) for _t, c in _outputs(out) if "Out:" in _plain(c)]
    assert len(values) == 2 and all("Out: True" in v for v in values), values


def test_what_calls_printed_shows_before_the_cells_value(kernel, mesh):
    # The worker prints much right before returning: its lines (through its agent)
    # are still on their way when the reply (direct) is in.
    define = kernel.run(
        "from monarch_kernel import Actor, endpoint\n"
        "class Chatty(Actor):\n    @endpoint\n    def talk(self, n):\n"
        "        for i in range(n):\n            print('chat', i)\n        return n\n"
        "chatty = procs.spawn('chatty', Chatty)"
    )
    assert define.error is None, define.traceback
    for _ in range(3):
        out = kernel.run("values = chatty.talk.call(3000).get()\nlist(values.values())")
        kinds = [
            (m["msg_type"], m["content"].get("text", ""))
            for m in out.raw
            if m["msg_type"] in ("stream", "execute_result")
        ]
        result_at = next(i for i, (t, _x) in enumerate(kinds) if t == "execute_result")
        before = "".join(x for t, x in kinds[:result_at] if t == "stream")
        assert before.count("chat 2999") == 2, f"{before.count('chat ')} lines before Out[]"


def test_ansi_colours_of_a_rank_reach_the_notebook_as_they_are(kernel, mesh):
    out = kernel.run("%%mesh --ranks 0\nprint('\\x1b[31mred\\x1b[0m and plain')")
    assert out.error is None, out.traceback
    assert any("\x1b[31mred\x1b[0m and plain" in t for t in _blocks(out).values())


def test_group_outputs_order_labels_a_ranks_rich_output_with_its_rank(kernel, mesh):
    out = kernel.run(
        "%%mesh --group-outputs order --ranks 1\nfrom IPython.display import display, HTML\n"
        "print('text first')\ndisplay(HTML('<i>then rich</i>'))"
    )
    assert out.error is None, out.traceback
    seq = [
        (m["msg_type"], m["content"].get("text") or m["content"].get("data", {}).get("text/html"))
        for m in out.raw
        if m["msg_type"] in ("stream", "display_data")
    ]
    joined = [x for _t, x in seq]
    assert joined.index("<i>then rich</i>") > 0
    assert "[rank 1] text first" in "".join(x for t, x in seq if t == "stream")
    assert "[rank 1]" in seq[joined.index("<i>then rich</i>") - 1][1]  # the label right before it


def test_what_the_front_end_sends_to_a_workers_widget_reaches_it(kernel, mesh):
    # DISPLAY-2, the way back: a slider dragged in the front end (a comm_msg on the
    # shell channel, as JupyterLab sends it) changes the widget on the worker.
    import time

    out = kernel.run("%%mesh --ranks 1\nimport ipywidgets\nslider = ipywidgets.IntSlider(value=7)\nslider")
    assert out.error is None, out.traceback
    opened = [m["content"] for m in out.raw if m["msg_type"] == "comm_open"]
    slider_id = next(
        c["comm_id"] for c in opened if c["data"]["state"].get("_model_name") == "IntSliderModel"
    )
    dragged = kernel.kc.session.msg(
        "comm_msg",
        {"comm_id": slider_id, "data": {"method": "update", "state": {"value": 42}, "buffer_paths": []}},
    )
    kernel.kc.shell_channel.send(dragged)
    deadline = time.monotonic() + 30
    seen = ""
    while time.monotonic() < deadline:
        seen = "".join(_blocks(kernel.run("%%mesh --ranks 1\nslider.value")).values())
        if "Out: 42" in seen:
            break
        time.sleep(0.2)
    assert "Out: 42" in seen, seen


def test_what_a_background_thread_of_a_worker_displays_reaches_the_running_cell(kernel, mesh):
    out = kernel.run(
        "%%mesh --ranks 0\nimport threading, time\nfrom IPython.display import display, HTML\n"
        "threading.Thread(target=lambda: display(HTML('<u>from a thread</u>'))).start()\ntime.sleep(1.0)"
    )
    assert out.error is None, out.traceback
    assert any(c.get("data", {}).get("text/html") == "<u>from a thread</u>" for _t, c in _outputs(out))


def test_mesh_run_runs_a_torchrun_script_on_every_rank_and_again_after_an_edit(kernel, mesh, tmp_path):
    script = tmp_path / "hello_spmd.py"
    script.write_text(
        "import os, sys\nprint('hello from', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], *sys.argv[1:])\n"
    )
    out = kernel.run(f"%mesh run {script} --lr 0.1")
    assert out.error is None, out.traceback
    shown = out.stdout + "".join(text for _, text, _ in out.displays) + "".join(out.html)
    assert "hello from 0 of 2 --lr 0.1" in shown and "hello from 1 of 2 --lr 0.1" in shown, out
    script.write_text("print('edited')\n")
    out = kernel.run(f"%mesh run {script}")
    assert out.error is None, out.traceback
    assert (out.stdout + "".join(out.html)).count("edited") >= 2, out
    out = kernel.run("%mesh run")
    assert "needs a script or a module" in out.stderr  # a UsageError, as IPython shows one
