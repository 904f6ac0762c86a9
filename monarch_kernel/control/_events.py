"""What a worker's output lines are, typed once.

A worker writes its control lines (the end of a call's output, a debugger's prompt,
a display message, an actor's failure) on its stdout, each starting with a mark the
native core owns (``native/src/agent/marks.rs``). The host agent reads the mark once
and sends each line as a ``LogLine`` with its ``kind`` and the text after the mark;
only ``TEXT`` lines reach the rank's log file, its ring buffer, ``logs()`` and the
Logs tab. Readers here dispatch on the kind, and decode a payload once, into the
objects below (ipykernel's iopub message types are the model).
"""

from __future__ import annotations

import base64
import enum
import json
from dataclasses import dataclass, field
from typing import Any

from monarch_kernel import _native


class LineKind(enum.IntEnum):
    """``LogLine.Kind`` (``proto/monarch_kernel/v1/agent.proto``; a unit test ties the two)."""

    TEXT = 0
    END_MARK = 1
    PROMPT = 2
    INPUT = 3
    DISPLAY = 4
    ACTOR_FAILURE = 5


@dataclass(frozen=True, slots=True)
class Prompt:
    """A rank waits for a line from the notebook: its pdb (``question`` None) or its
    ``input()``, with the question it asked."""

    rank: int
    origin: str
    question: str | None

    @classmethod
    def of(cls, line: Any) -> Prompt:
        return cls(line.rank, line.origin, line.text if line.kind == LineKind.INPUT else None)


@dataclass(frozen=True, slots=True)
class ActorFailure:
    """One of a worker's actors failed (OWN-1), for its mesh's controller."""

    rank: int
    actor: str
    message: str

    @classmethod
    def of(cls, line: Any) -> ActorFailure:
        try:
            body = json.loads(line.text)
            return cls(line.rank, str(body.get("actor", "")), str(body["message"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            what = f"its report could not be read: {line.text[:200]!r}"
            return cls(line.rank, "", f"an actor on rank {line.rank} failed ({what})")


#: A widget's MIME type: its model lives in the worker, where no front end can reach it.
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@dataclass(slots=True)
class DisplayMessage:
    """A worker's display message (DISPLAY-1), decoded once: a bundle (``data``,
    ``metadata``, a display id, ``update``), a clear, or a bridged widget's comm
    message (``comm``; DISPLAY-2). ``body`` is the message as the worker sent it."""

    mesh: str
    rank: int
    body: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, mesh: str, line: Any, token: str) -> DisplayMessage:
        """Inline JSON, or pulled through the transfer engine with the mesh's ``token``
        when it was large; a message that cannot be read becomes text saying so."""
        try:
            body: dict[str, Any] = json.loads(line.text)
            if "pull" in body:
                desc = _native.Descriptor(base64.b64decode(body["pull"]))
                body = json.loads(bytes(desc.fetch_new(token)))
        except Exception as e:  # shown, never lost silently
            body = {"data": {"text/plain": f"[{mesh} {line.rank}] (a display could not be read: {e})"}}
        return cls(mesh, line.rank, body)

    @property
    def label(self) -> str:
        return f"[{self.mesh} {self.rank}]"

    @property
    def comm(self) -> str | None:
        """DISPLAY-2: ``comm_open``/``comm_msg``/``comm_close`` of a worker's widget."""
        kind = self.body.get("comm")
        return None if kind is None else str(kind)

    @property
    def clear(self) -> bool:
        return bool(self.body.get("clear"))

    @property
    def wait(self) -> bool:
        return bool(self.body.get("wait"))

    @property
    def update(self) -> bool:
        return bool(self.body.get("update"))

    @property
    def display_id(self) -> str | None:
        wid = (self.body.get("transient") or {}).get("display_id")
        return str(wid) if wid else None

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self.body.get("metadata") or {})

    def data(self, bridged: set[str]) -> dict[str, Any]:
        """The bundle as the notebook can show it: a widget whose model was not
        ``bridged`` (DISPLAY-2) becomes its text form, with a note saying why."""
        data: dict[str, Any] = self.body.get("data") or {}
        if WIDGET_MIME not in data or (data[WIDGET_MIME] or {}).get("model_id") in bridged:
            return data
        out = {k: v for k, v in data.items() if k != WIDGET_MIME}
        note = f"(a widget from rank {self.rank} of {self.mesh!r} whose model did not reach the notebook: it shows as text)"
        out["text/plain"] = f"{out.get('text/plain', '')}\n{note}".lstrip("\n")
        return out

    def as_text(self) -> str:
        """What a terminal shows of it (a script's output): its plain text form."""
        text = (self.body.get("data") or {}).get("text/plain")
        return "" if text is None or self.clear or self.comm else str(text)


__all__ = ["WIDGET_MIME", "ActorFailure", "DisplayMessage", "LineKind", "Prompt"]
