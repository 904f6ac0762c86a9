"""The formats that Python and Rust share, in one place.

Each is defined once, by the side that parses it, and the other side takes it from
there: what the native core owns comes from ``_native`` (so the two can never
disagree); what only Python reads is defined here. ``tests/unit/test_wire.py`` checks
that the native core parses what Python writes.

| name | owner | what |
|---|---|---|
| ``MESSAGE_HEADER`` | Rust (transfer engine) | a message whose large buffers went through the engine starts with it |
| ``FLUSH_MARK``, ``PROMPT_MARK``, ``INPUT_MARK``, ``DISPLAY_MARK``, ``ACTOR_FAILURE_MARK`` | Rust (host agent) | a worker's control lines (a flush, a pdb prompt, ``input()``'s question, a display message: DISPLAY-1, an actor's failure: OWN-1); the agent sends each as a ``LogLine`` of its kind with the text after the mark, never as output (``control.LineKind``) |
| ``ORIGIN_START``/``ORIGIN_END`` | Rust (host agent) | a worker line's origin tag: ``\\x1e ORIGIN \\x1f`` before the text |
| ``TRANSFER_STREAMS_ENV`` | Rust (transfer engine) | environment variable: parallel TCP streams per transfer across hosts |
| ``BUILTIN`` | Python | the actor every worker has without spawning it |
| ``ACTOR_FAILED`` | Python | a refused call's text starts with it when the actor failed (DISPATCH-4) |
"""

from __future__ import annotations

from monarch_kernel import _native

MESSAGE_HEADER: bytes = bytes(_native.MESSAGE_HEADER)
FLUSH_MARK: str = _native.FLUSH_MARK
PROMPT_MARK: str = _native.PROMPT_MARK
INPUT_MARK: str = _native.INPUT_MARK
DISPLAY_MARK: str = _native.DISPLAY_MARK
ACTOR_FAILURE_MARK: str = _native.ACTOR_FAILURE_MARK
ORIGIN_START: str = _native.ORIGIN_START
ORIGIN_END: str = _native.ORIGIN_END
TRANSFER_STREAMS_ENV: str = _native.TRANSFER_STREAMS_ENV
DEFAULT_TRANSFER_STREAMS: int = _native.DEFAULT_TRANSFER_STREAMS

#: The actor every worker has, without spawning: see ``worker._builtin``.
BUILTIN = "__monarch__"
#: A refusal (``REPLY_REJECTED``) that says the actor failed (DISPATCH-4): the caller
#: raises a SupervisionError with the text after it.
ACTOR_FAILED = "actor failed: "

__all__ = [
    "ACTOR_FAILED",
    "ACTOR_FAILURE_MARK",
    "BUILTIN",
    "DEFAULT_TRANSFER_STREAMS",
    "DISPLAY_MARK",
    "FLUSH_MARK",
    "INPUT_MARK",
    "MESSAGE_HEADER",
    "ORIGIN_END",
    "ORIGIN_START",
    "PROMPT_MARK",
    "TRANSFER_STREAMS_ENV",
]
