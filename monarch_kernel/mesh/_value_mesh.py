"""``ValueMesh``: one value per point of a mesh, e.g. the results of ``call()``."""

from __future__ import annotations

import pprint
import textwrap
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

from monarch_kernel._ranks import ranks_span
from monarch_kernel.mesh._shape import MeshTrait, Point, Shape

R = TypeVar("R")

#: From this many values on, a notebook shows a value mesh grouped by value
#: (``_repr_pretty_``), as a ``%%mesh`` cell merges the lines of many ranks.
GROUP_FROM = 33
#: At most this many distinct values are shown in a grouped view.
SHOWN = 32
#: A value's text longer than this is cut in a grouped view.
VALUE_CHARS = 200


class ValueMesh(MeshTrait, Generic[R]):
    """Values laid out over named dims (row-major)."""

    def __init__(self, shape: Shape, values: Sequence[R]) -> None:
        if len(values) != len(shape):
            raise ValueError(f"a ValueMesh over {shape.extent} needs {len(shape)} values, got {len(values)}")
        # Values are indexed by base rank so slices can share them.
        self._shape = shape if shape.dense else Shape(shape.extent)
        self._values = list(values)

    def _new_with_shape(self, shape: Shape) -> ValueMesh[R]:
        return ValueMesh(Shape(shape.extent), [self._values[r] for r in shape.ranks])

    def values(self) -> list[R]:
        """The values in rank order."""
        return list(self._values)

    def get(self, rank: int) -> R:
        """The value of the proc at flat index ``rank`` of this mesh."""
        return self._values[rank]

    def items(self) -> Iterator[tuple[Point, R]]:
        """``(Point, value)`` pairs in rank order."""
        for p, v in zip(self._shape.points(), self._values):
            yield p, v

    def __iter__(self) -> Iterator[tuple[Point, R]]:
        return self.items()

    def item(self, **coords: int) -> R:
        """The value at ``coords``, which must name every dim (none for a 0-d mesh)."""
        extra = [k for k in coords if k not in self._shape.labels]
        if extra:
            raise KeyError(f"item has extra dimensions: {extra}")
        missing = [k for k in self._shape.labels if k not in coords]
        if missing:
            raise KeyError(f"item() needs a coordinate for every dimension; missing: {missing}")
        sub = self._shape.slice(**coords)
        return self._values[sub.ranks[0]]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ValueMesh) and self.extent == other.extent and self._values == other._values

    def __repr__(self) -> str:
        return f"ValueMesh({self.extent}):\n" + textwrap.indent(pprint.pformat(tuple(self.items())), "  ")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """A notebook's view: ``repr`` up to ``GROUP_FROM`` values; from there each
        distinct value once, with the ranks (flat indices) that have it:
        ``[ranks 0-1023] 0.31``, not 1,024 lines."""
        if cycle or len(self._values) < GROUP_FROM:
            p.text("ValueMesh(...)" if cycle else repr(self))
            return
        groups: dict[str, list[int]] = {}
        for rank, v in enumerate(self._values):
            text = repr(v)
            if len(text) > VALUE_CHARS:
                text = text[: VALUE_CHARS - 3] + "..."
            groups.setdefault(text, []).append(rank)
        lines = [f"ValueMesh({self.extent}): {len(self._values):,} values, {len(groups):,} distinct"]
        lines += [f"  [{ranks_span(ranks)}] {text}" for text, ranks in list(groups.items())[:SHOWN]]
        if len(groups) > SHOWN:
            lines.append(f"  ... and {len(groups) - SHOWN:,} more (.values() has them all, .item(...) one)")
        p.text("\n".join(lines))

    def __reduce__(self) -> Any:
        return (ValueMesh, (self._shape, self._values))
