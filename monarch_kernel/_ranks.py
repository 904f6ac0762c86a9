"""How a set of ranks is written for a person: as runs (``0-3``, ``8``, ``10-11``),
the one way every view (``%%mesh`` merged lines, merged log lines, ``show`` of a mesh
tensor) spells them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def rank_runs(ranks: Iterable[int]) -> list[str]:
    """``ranks`` (any ints) as sorted runs of consecutive ranks: ``["0-3", "8"]``."""
    got = sorted(set(ranks))
    if not got:
        return []
    runs: list[str] = []
    start = prev = got[0]
    for r in [*got[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return runs


def ranks_span(ranks: Any) -> str:
    """``rank 3``, or ``ranks 0-3, 8, 10-11``: ``ranks`` (any iterable of ints) as
    runs, sorted."""
    got = set(ranks)
    return f"rank {next(iter(got))}" if len(got) == 1 else "ranks " + ", ".join(rank_runs(got))


__all__ = ["rank_runs", "ranks_span"]
