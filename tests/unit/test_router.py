"""ROUTE-4, ROUTE-5: a worker's line that comes as a cell ends is sent before the
cell's end or waits for the next cell; never sent for a cell that has ended."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from monarch_kernel.controller import LineKind
from monarch_kernel.kernel._router import Router


def test_a_line_routed_to_a_cell_is_handed_on_before_the_cell_finishes() -> None:
    sent: list[tuple[str, str, float]] = []
    sending = threading.Event()

    def slow_send(parent: dict[str, Any], stream: str, text: Any) -> None:
        sending.set()
        time.sleep(0.5)  # (a watch thread preempted between routing and sending)
        sent.append((parent["id"], text, time.monotonic()))

    router = Router(slow_send)
    router.cell_started("cell-1", {"id": "cell-1"})
    session = SimpleNamespace(name="m", window=None, token="")
    line = SimpleNamespace(origin="cell-1", kind=LineKind.TEXT, rank=4, stream="stdout", text="--Call--")
    worker = threading.Thread(target=router.on_line, args=(session, line))
    worker.start()
    assert sending.wait(10)
    router.cell_finished()  # the cell ends while the line is on its way
    finished = time.monotonic()
    worker.join(10)
    assert sent and sent[0][:2] == ("cell-1", "[m 4] --Call--\n"), sent
    assert sent[0][2] <= finished, "the line was handed on after the cell had finished"
    # A line after the end waits for the next cell.
    router.on_line(session, SimpleNamespace(**{**vars(line), "text": "later"}))
    pending, _ = router.cell_started("cell-2", {"id": "cell-2"})
    assert pending == [("stdout", "[m 4] later\n")]
