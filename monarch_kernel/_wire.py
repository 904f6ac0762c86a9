"""The formats that Python and Rust share, in one place.

Each is defined once, by the side that parses it, and the other side takes it from
there: what the native core owns comes from ``_native`` (so the two can never
disagree); what only Python reads is defined here. ``tests/unit/test_wire.py`` checks
that the native core parses what Python writes.

| name | owner | what |
|---|---|---|
| ``MESSAGE_HEADER`` | Rust (transfer engine) | a message whose large buffers went through the engine starts with it |
| ``FLUSH_MARK`` | Rust (host agent) | a line a worker writes when asked to flush; the agent reports it as a mark, never as output |
| ``ORIGIN_START``/``ORIGIN_END`` | Rust (host agent) | a worker line's origin tag: ``\\x1e ORIGIN \\x1f`` before the text |
| ``TRANSFER_STREAMS_ENV`` | Rust (transfer engine) | environment variable: parallel TCP streams per transfer across hosts |
| ``PROMPT_MARK``, ``INPUT_MARK`` | Python | a worker asks the notebook for a line (pdb, ``input()``) |
| ``BUILTIN`` | Python | the actor every worker has without spawning it |
| ``DISPLAY_MARK`` | Python | a worker line that carries a display bundle to the calling cell (JSON after the mark; DISPLAY-1) |
| ``ACTOR_FAILED`` | Python | a refused call's text starts with it when the actor failed (DISPATCH-4) |
| ``SUPERVISION_MARK`` | Python | a worker line that carries a failure up to the mesh's controller (JSON after the mark; OWN-1) |
"""

from __future__ import annotations

from monarch_kernel import _native

MESSAGE_HEADER: bytes = bytes(_native.MESSAGE_HEADER)
FLUSH_MARK: str = _native.FLUSH_MARK
ORIGIN_START: str = _native.ORIGIN_START
ORIGIN_END: str = _native.ORIGIN_END
TRANSFER_STREAMS_ENV: str = _native.TRANSFER_STREAMS_ENV
DEFAULT_TRANSFER_STREAMS: int = _native.DEFAULT_TRANSFER_STREAMS

#: A worker's pdb waits for a line from the notebook.
PROMPT_MARK = "\x1d monarch pdb input"
#: A worker's ``input()`` waits for a line; the question follows the mark.
INPUT_MARK = "\x1d monarch input "
#: The actor every worker has, without spawning: see ``worker._builtin``.
BUILTIN = "__monarch__"
#: A failure of one of the worker's actors, for its mesh's controller (OWN-1): JSON
#: ``{"actor", "message"}`` follows the mark.
SUPERVISION_MARK = "\x1d monarch supervision "
#: A worker's rich output (DISPLAY-1): JSON of a display message follows the mark.
DISPLAY_MARK = "\x1d monarch display "
#: A refusal (``REPLY_REJECTED``) that says the actor failed (DISPATCH-4): the caller
#: raises a SupervisionError with the text after it.
ACTOR_FAILED = "actor failed: "

__all__ = [
    "ACTOR_FAILED",
    "BUILTIN",
    "DEFAULT_TRANSFER_STREAMS",
    "DISPLAY_MARK",
    "FLUSH_MARK",
    "INPUT_MARK",
    "SUPERVISION_MARK",
    "MESSAGE_HEADER",
    "ORIGIN_END",
    "ORIGIN_START",
    "PROMPT_MARK",
    "TRANSFER_STREAMS_ENV",
]
