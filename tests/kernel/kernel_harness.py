"""A monarch kernel driven through jupyter_client, for the kernel tests: run a cell,
collect what it sent (streams, displays, errors, input requests)."""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import KernelManager, start_new_kernel

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


def start(env: dict[str, str] | None = None) -> Kernel:
    """A monarch kernel; ``env``: added to its environment."""
    extra = {} if env is None else {"env": {**os.environ, **env}}
    km, kc = start_new_kernel(kernel_name="monarch", startup_timeout=TIMEOUT, **extra)
    # Speak as JupyterLab does: its requests name the cell, and the kernel shows such
    # a client live displays, updated in place (CLIENTS-1). Without it this client
    # looks like jupyter console, which gets each output once, as text
    # (tests/kernel/test_console.py).
    kc.session.metadata["cellId"] = "kernel-tests"
    return Kernel(km, kc)


def stop(k: Kernel) -> None:
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=True)


#: An actor that prints what it is told (after an optional delay) and returns it,
#: defined in the kernel by the tests that need one.
TALKER = (
    "from monarch_kernel import Actor, endpoint\n"
    "import time\n"
    "class Talker(Actor):\n"
    "    @endpoint\n"
    "    def say(self, text, delay=0.0):\n"
    "        time.sleep(delay)\n"
    "        print(text, flush=True)\n"
    "        return text\n"
)
