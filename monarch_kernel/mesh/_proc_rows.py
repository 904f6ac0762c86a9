"""A mesh's procs as text and HTML for a person: ``ProcMesh``'s repr in a notebook
(``_repr_pretty_``, ``_repr_html_``, what nbconvert and GitHub show), ``%mesh status``
and ``%mesh attach``. A line (or table row) per proc up to ``COMPACT_FROM`` procs;
from there, as the inspector's grid from the same size, a summary: how many procs in
each state, each state's ranks as runs, and a line per proc that is not alive (the
ones a person looks for among 1,024)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from monarch_kernel._ranks import ranks_span

#: From this many procs on, the views summarize (the inspector's and the Meshes
#: panel's grid starts at the same size).
COMPACT_FROM = 33
#: At most this many procs that are not alive are listed one by one in a summary.
LISTED = 32
_COLORS = {"alive": "#2a7", "unresponsive": "#c80", "dead": "#c33", "lost": "#c33", "stopped": "#888"}


@dataclass(frozen=True)
class ProcRow:
    """One proc of a mesh as the views show it (``ProcMesh.proc_rows()``)."""

    rank: int
    #: "alive", "unresponsive", "dead", "stopped" or "lost".
    state: str
    #: 0 where the agent did not say (this process does not control the mesh).
    pid: int = 0
    host: str = ""
    restarts: int = 0
    #: The first line of its death report, if it died.
    error: str = ""


def states_count(states: Sequence[str], hosts: int = 0) -> str:
    """``1,024 procs on 64 hosts: 1,023 alive, 1 dead``: how many procs are in each
    state (``hosts``: how many hosts they are on, 0 to leave it out)."""
    counts: dict[str, int] = {}
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    on = f" on {hosts} hosts" if hosts else ""
    return f"{len(states):,} procs{on}: " + ", ".join(f"{n:,} {s}" for s, n in counts.items())


def row_line(row: ProcRow) -> str:
    where = f"  {row.host}" if row.host else ""
    line = f"  rank {row.rank}: {row.state:<12} pid {row.pid or '?'}  restarts {row.restarts}{where}"
    return f"{line}  ({row.error})" if row.error else line


def text_lines(rows: Sequence[ProcRow]) -> list[str]:
    """The procs as lines of text: one per proc, or the summary (module doc)."""
    if len(rows) < COMPACT_FROM:
        return [row_line(r) for r in rows]
    odd = [r for r in rows if r.state != "alive"]
    lines = [f"  {line}" for line in _summary(rows)] + [row_line(r) for r in odd[:LISTED]]
    if len(odd) > LISTED:
        lines.append(f"  ... and {len(odd) - LISTED} more procs that are not alive")
    return lines


def status_text(title: str, rows: Sequence[ProcRow]) -> str:
    """``%mesh status``'s text: ``title`` with the number of procs (left to the summary
    when there is one: it counts them), then ``text_lines``."""
    head = title if len(rows) >= COMPACT_FROM else f"{title}, {len(rows)} procs"
    return "\n".join([f"{head}:", *text_lines(rows)])


def html_table(rows: Sequence[ProcRow]) -> str:
    """The procs as an HTML table: a row per proc, or the summary then a row per proc
    that is not alive."""
    compact = len(rows) >= COMPACT_FROM
    listed = [r for r in rows if r.state != "alive"][:LISTED] if compact else rows
    head = "<tr><th>rank</th><th>state</th><th>pid</th><th>restarts</th></tr>"
    cells = "".join(
        f"<tr><td>{r.rank}</td><td style='color:{_COLORS.get(r.state, '#000')}'>{html.escape(r.state)}</td>"
        f"<td>{r.pid or ''}</td><td>{r.restarts if r.pid else ''}</td></tr>"
        for r in listed
    )
    table = f"<table>{head}{cells}</table>" if listed else ""
    summary = f"<div>{'<br>'.join(html.escape(line) for line in _summary(rows))}</div>" if compact else ""
    return summary + table


def _summary(rows: Sequence[ProcRow]) -> list[str]:
    """How many procs are in each state, then each state's ranks as runs."""
    by_state: dict[str, list[int]] = {}
    for r in rows:
        by_state.setdefault(r.state, []).append(r.rank)
    hosts = len({r.host for r in rows if r.host})
    return [states_count([r.state for r in rows], hosts)] + [
        f"{state:<12} {ranks_span(ranks)}" for state, ranks in by_state.items()
    ]


__all__ = ["COMPACT_FROM", "ProcRow", "html_table", "row_line", "states_count", "status_text", "text_lines"]
