"""The live blocks of a ``%%mesh`` cell (``kernel/_cells._Blocks``), driven by a clock
of the test's own: what reaches the front end stays about what the ranks printed, however
the lines are spread over the kernel's ticks (a loaded machine wakes the kernel for a
few lines at a time), and every line shows soon, once, in its rank's blocks, in order."""

from __future__ import annotations

from typing import Any

import pytest

from monarch_kernel.kernel import _cells


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _FrontEnd:
    """Stands for IPython's ``display``: records each display and update (its text)."""

    def __init__(self) -> None:
        self.sent: list[str] = []  # the text of each message, in sending order
        self.blocks: list[str] = []  # each block's text as last sent

    def display(self, obj: Any, display_id: bool = False) -> Any:
        number = len(self.blocks)
        self.blocks.append("")
        front = self

        class Handle:
            def update(self, new: Any) -> None:
                front._send(number, repr(new))

        self._send(number, repr(obj))
        return Handle()

    def _send(self, number: int, text: str) -> None:
        self.sent.append(text)
        self.blocks[number] = text

    def lines_of(self, rank: int) -> list[str]:
        """The rank's lines as the front end shows them, its blocks checked."""
        blocks = [b for b in self.blocks if b.startswith(f"[rank {rank}]")]
        assert all(b.startswith(f"[rank {rank}] (continued)") for b in blocks[1:]), blocks[:3]
        return [ln for b in blocks for ln in b.split("\n")[1:]]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(_cells, "time", c)
    return c


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch) -> _FrontEnd:
    fe = _FrontEnd()
    monkeypatch.setattr(_cells, "display", fe.display)
    return fe


def _feed(
    blocks: Any, clock: _Clock, lines: list[str], per_tick: int, tick_s: float, front: _FrontEnd | None = None
) -> list[float]:
    """Gives ``blocks`` ``per_tick`` lines of rank 0 and of rank 1 each tick (``tick_s``
    apart, two drains each, as the follow loop wakes); with ``front``, returns how
    long each of rank 0's lines waited until the front end showed it."""
    waits: list[float] = []
    arrived: list[float] = []
    seen = 0

    def look() -> None:
        nonlocal seen
        if front is None:
            return
        shown = len(front.lines_of(0))
        waits.extend(clock.now - t for t in arrived[seen:shown])
        seen = shown

    for i in range(0, len(lines), per_tick):
        for text in lines[i : i + per_tick]:
            for rank in (0, 1):
                blocks.add(("m", rank, "stdout", text))
            arrived.append(clock.now)
        for _ in range(2):
            blocks.drain(None)
            look()
            clock.now += tick_s / 2
    while front is not None and seen < len(lines):  # the cell runs on, and so do its ticks
        blocks.drain(None)
        look()
        clock.now += tick_s / 2
    return waits


@pytest.mark.parametrize("per_tick", [20, 100, 1000])
def test_a_rank_that_prints_a_lot_is_sent_about_once_however_few_lines_each_tick_brings(
    clock, front, per_tick
):
    """20 lines a tick is about what a loaded machine brought (3 KB/s a rank)."""
    blocks = _cells._Blocks([0, 1], "rank")
    lines = [f"line {i}" for i in range(30_000)]
    _feed(blocks, clock, lines, per_tick, tick_s=0.06)
    blocks.drain(None, force=True)
    for rank in (0, 1):
        assert front.lines_of(rank) == lines  # none lost, none twice, in order
    printed = 2 * sum(len(text) + 1 for text in lines)
    sent = sum(len(text) for text in front.sent)
    assert sent < 2 * printed, (sent, printed)


def test_a_rank_that_prints_slowly_shows_each_line_within_a_second_in_long_blocks(clock, front):
    blocks, start = _cells._Blocks([0, 1], "rank"), clock.now
    lines = [f"step {i}: loss {1 / (i + 1):.6f}" for i in range(600)]
    waits = _feed(blocks, clock, lines, per_tick=1, tick_s=0.5, front=front)
    took = clock.now - start
    blocks.drain(None, force=True)
    for rank in (0, 1):
        assert front.lines_of(rank) == lines
    assert len(waits) == len(lines) and max(waits) <= 1.5, max(waits)
    assert len(front.blocks) <= 20, len(front.blocks)  # not a "(continued)" every few lines
    # Showing each line as it comes costs more than once, but a few KB/s at most.
    sent = sum(len(text) for text in front.sent)
    assert sent / took < 2 * 4096, sent / took
