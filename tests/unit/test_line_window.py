"""``LineWindow``: worker lines merged over a window (``logging_option``'s
``aggregate_window_sec``), with real ``LogLine`` messages as the agents send them."""

from __future__ import annotations

import threading

from monarch_kernel.control import LineWindow, MergedLine, ranks_label
from monarch_kernel.v1 import agent_pb2


def _line(rank: int, text: str, stream: str = "stdout", origin: str = "cell-1") -> agent_pb2.LogLine:
    return agent_pb2.LogLine(rank=rank, text=text, stream=stream, origin=origin, pid=1000 + rank)


def test_identical_lines_from_many_ranks_come_out_once_with_their_ranks_and_count():
    out: list[MergedLine] = []
    window = LineWindow(3600.0, out.append)  # (flushed by hand here)
    for rank in (3, 0, 1, 2, 5):
        window.add(_line(rank, "loss 0.31"))
    window.add(_line(4, "only me"))
    window.add(_line(4, "loss 0.31", stream="stderr"))  # another stream: another line
    window.add(_line(0, "loss 0.31", origin="cell-2"))  # another cell: another line
    window.add(_line(0, "loss 0.31"))  # rank 0 again: counted, named once
    window.flush()
    assert [(m.label, m.shown, m.stream, m.origin) for m in out] == [
        ("ranks 0-3,5", "[6 similar log lines] loss 0.31", "stdout", "cell-1"),
        ("4", "only me", "stdout", "cell-1"),
        ("4", "loss 0.31", "stderr", "cell-1"),
        ("0", "loss 0.31", "stdout", "cell-2"),
    ]
    assert out[0].rank == 0 and out[1].pid == 1004
    window.flush()
    assert len(out) == 4  # nothing held twice


def test_the_window_lets_its_lines_out_when_it_ends():
    done = threading.Event()
    out: list[MergedLine] = []

    def emit(m: MergedLine) -> None:
        out.append(m)
        done.set()

    window = LineWindow(0.05, emit)
    window.add(_line(0, "tick"))
    window.add(_line(1, "tick"))
    assert done.wait(30)
    assert [(m.label, m.shown) for m in out] == [("ranks 0-1", "[2 similar log lines] tick")]


def test_rank_labels():
    assert ranks_label((7,)) == "7"
    assert ranks_label((0, 1, 2, 3)) == "ranks 0-3"
    assert ranks_label((0, 2, 3, 9)) == "ranks 0,2-3,9"
