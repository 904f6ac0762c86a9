"""Progress of long waits in the notebook: a wait that lasts more than a second
(a blocking ``.get()``, a spawn, a ``%%mesh`` cell) shows a progress bar, updated in
place, and removes it when done; short waits show nothing. Plain HTML ``<progress>``
(no widget front end needed), so it also renders in nbconvert output, with its words
as ``text/plain``; a client that shows displays once, as text (CLIENTS-1), gets that
line once, never redrawn or removed."""

from __future__ import annotations

import html
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from IPython.display import display, update_display

from monarch_kernel import _native, controller
from monarch_kernel.kernel._clients import updates_here

#: Seconds between updates.
EVERY = 0.25
#: Seconds into the progress bar (two into the wait) when the cell says what it waits
#: behind: a rank busy with another call, or one that does not answer.
SAY_WAIT_S = 1.0


class Bar:
    """A progress bar shown in the running cell (``live``: redrawn in place, by
    default as the cell's client can show it, CLIENTS-1)."""

    def __init__(self, total: int, what: str, live: bool | None = None) -> None:
        self.total, self.what, self.start = total, what, time.monotonic()
        self.live = updates_here() if live is None else live
        first = self._bundle(0)
        self.shown = first["text/html"]
        self.display_id = uuid.uuid4().hex
        display(first, raw=True, display_id=self.display_id)

    def _bundle(self, done: int) -> dict[str, str]:
        """The bar as HTML, and its words as text for clients that show only text."""
        secs = time.monotonic() - self.start + 1.0
        words = f"{self.what}: {done}/{self.total} done, {secs:.0f} s"
        return {
            "text/html": f"<progress value='{done}' max='{self.total}' style='width: 16em'></progress> "
            f"<span>{html.escape(words)}</span>",
            "text/plain": words,
        }

    def update(self, done: int) -> None:
        """Redraws the bar if what it says changed (at most once a second, or a step)."""
        if not self.live:
            return
        now = self._bundle(done)
        if now["text/html"] != self.shown:
            self.shown = now["text/html"]
            update_display(now, display_id=self.display_id, raw=True)

    def close(self) -> None:
        if self.live:
            update_display({"text/html": "", "text/plain": ""}, display_id=self.display_id, raw=True)


def bar_here(total: int, what: str) -> Bar | None:
    """A progress bar in the running cell (the front end's ``progress``); None off the
    kernel's main thread, where no cell's output goes."""
    return Bar(total, what) if threading.current_thread() is threading.main_thread() else None


def slow_wait(calls: Sequence[Any], timeout: float | None, what: str) -> list[Any]:
    """``wait_all`` with a progress bar (the front end's ``slow_wait``, see ``controller.Frontend``); only on
    the kernel's main thread, where a cell's output goes."""
    if threading.current_thread() is not threading.main_thread():
        return _native.wait_all(calls, timeout, fail_fast=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    bar = Bar(len(calls), what)
    say_at: float | None = time.monotonic() + SAY_WAIT_S
    try:
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = EVERY if left is None else min(EVERY, left)
            try:
                return _native.wait_all(calls, step, fail_fast=True)
            except TimeoutError:
                if left is not None and left <= EVERY:
                    raise TimeoutError(f"{what}: not done within the timeout") from None
                bar.update(sum(c.done() for c in calls))
                answer_prompts()
                if say_at is not None and time.monotonic() >= say_at:
                    say_at = None
                    say_what_it_waits_for(calls)
    finally:
        bar.close()


def say_what_it_waits_for(calls: Sequence[Any]) -> None:
    """Says in the cell (stderr) which ranks the wait is stuck behind, if any."""
    for line in controller.describe_wait(calls):
        print(f"monarch: {line}", file=sys.stderr, flush=True)


def answer_prompts(drain: Any = None) -> None:
    """Remote debuggers waiting for a line ask the user now (from the main thread,
    the one that may use the kernel's stdin); ``drain()`` shows captured output first."""
    from IPython import get_ipython

    shell = get_ipython()
    router = getattr(getattr(shell, "kernel", None), "router", None)
    if router is not None:
        router.answer_prompts(input, drain=drain)


__all__ = ["Bar", "answer_prompts", "bar_here", "slow_wait"]
