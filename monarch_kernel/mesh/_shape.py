"""Named mesh dimensions: ``Extent``, ``Point`` and ``Shape`` (a slice of a base mesh)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from monarch_kernel.errors import DimensionError, MeshIndexError


class Extent(Mapping[str, int]):
    """Labelled sizes, e.g. ``{procs: 4}``; a read-only mapping label -> size."""

    __slots__ = ("labels", "sizes")

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        if len(labels) != len(sizes):
            raise ValueError(f"{len(labels)} labels but {len(sizes)} sizes")
        self.labels: tuple[str, ...] = tuple(labels)
        self.sizes: tuple[int, ...] = tuple(int(s) for s in sizes)

    @property
    def nelements(self) -> int:
        return math.prod(self.sizes)

    def __getitem__(self, label: str) -> int:
        try:
            return self.sizes[self.labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{k}: {v}" for k, v in zip(self.labels, self.sizes)) + "}"

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Extent):
            return self.labels == other.labels and self.sizes == other.sizes
        return Mapping.__eq__(self, other)

    def __hash__(self) -> int:
        return hash((self.labels, self.sizes))

    def __reduce__(self) -> Any:
        return (Extent, (self.labels, self.sizes))


class Point(Mapping[str, int]):
    """A coordinate in a mesh: label -> index, plus the row-major ``rank``.

    ``str(Point(1, Extent(["procs"], [4])))`` is ``{'procs': 1/4}``.
    """

    __slots__ = ("rank", "extent")

    def __init__(self, rank: int, extent: Extent) -> None:
        self.rank = int(rank)
        self.extent = extent

    def _coords(self) -> list[int]:
        out: list[int] = []
        r = self.rank
        for size in reversed(self.extent.sizes):
            out.append(r % size)
            r //= size
        return out[::-1]

    def __getitem__(self, label: str) -> int:
        try:
            i = self.extent.labels.index(label)
        except ValueError:
            raise KeyError(label) from None
        return self._coords()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self.extent.labels)

    def __len__(self) -> int:
        return len(self.extent.labels)

    def size(self, label: str) -> int:
        return self.extent[label]

    def __str__(self) -> str:
        parts = [f"'{k}': {c}/{s}" for k, c, s in zip(self.extent.labels, self._coords(), self.extent.sizes)]
        return "{" + ", ".join(parts) + "}"

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self.rank == other.rank and self.extent == other.extent
        return Mapping.__eq__(self, other)

    def __hash__(self) -> int:
        return hash((self.rank, self.extent))

    def __reduce__(self) -> Any:
        return (Point, (self.rank, self.extent))


class Shape:
    """A (possibly sliced) view of a base mesh: labelled dims, and for each local
    row-major index the rank in the base mesh (its proc rank)."""

    __slots__ = ("extent", "ranks", "dense")

    def __init__(self, extent: Extent, ranks: Sequence[int] | None = None) -> None:
        self.extent = extent
        self.ranks: tuple[int, ...] = tuple(range(extent.nelements)) if ranks is None else tuple(ranks)
        if len(self.ranks) != extent.nelements:
            raise ValueError(f"shape {extent} needs {extent.nelements} ranks, got {len(self.ranks)}")
        #: Whether its ranks are its own indices, ``(0, ..., n - 1)``: known once, not
        #: per ``ValueMesh`` made over it (1,024 ranks compared per call).
        self.dense: bool = ranks is None or self.ranks == tuple(range(len(self.ranks)))

    @classmethod
    def of(cls, sizes: Mapping[str, int]) -> Shape:
        return cls(Extent(list(sizes), list(sizes.values())))

    @property
    def labels(self) -> tuple[str, ...]:
        return self.extent.labels

    @property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self.extent.labels, self.extent.sizes))

    def __len__(self) -> int:
        return len(self.ranks)

    def points(self) -> Iterator[Point]:
        return (self.point(i) for i in range(len(self.ranks)))

    def point(self, i: int) -> Point:
        """The point of local index ``i``."""
        return Point(i, self.extent)

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        if dim is None:
            return len(self.ranks)
        dims = [dim] if isinstance(dim, str) else list(dim)
        for d in dims:
            self._check_dim(d)
        return math.prod(self.extent[d] for d in dims)

    def _check_dim(self, label: str) -> None:
        if label not in self.extent.labels:
            have = ", ".join(repr(x) for x in self.extent.labels) or "none"
            raise DimensionError(f"Shape does not have dimension labeled {label!r} (its dimensions: {have})")

    def slice(self, **kwargs: int | slice) -> Shape:
        """Selects along named dims: an int removes the dim, a slice keeps it."""
        for label in kwargs:
            self._check_dim(label)
        per_dim: list[list[int]] = []
        labels: list[str] = []
        sizes: list[int] = []
        for label, size in zip(self.extent.labels, self.extent.sizes):
            sel = kwargs.get(label)
            if sel is None:
                idx = list(range(size))
                labels.append(label)
                sizes.append(size)
            elif isinstance(sel, slice):
                idx = list(range(size))[sel]
                labels.append(label)
                sizes.append(len(idx))
            elif isinstance(sel, int) and not isinstance(sel, bool):
                if not 0 <= sel < size:
                    raise MeshIndexError(f"index {sel} out of range for dimension {label!r} of size {size}")
                idx = [sel]
            else:
                raise DimensionError(f"slice({label}=...) takes an int or a slice, not {type(sel).__name__}")
            per_dim.append(idx)
        strides = [math.prod(self.extent.sizes[i + 1 :]) for i in range(len(self.extent.sizes))]
        ranks = [
            self.ranks[sum(c * s for c, s in zip(coords, strides))] for coords in itertools.product(*per_dim)
        ]
        return Shape(Extent(labels, sizes), ranks)

    def flatten(self, name: str) -> Shape:
        return Shape(Extent([name], [len(self.ranks)]), self.ranks)

    def rename(self, **names: str) -> Shape:
        """The same procs with dims renamed (``rename(host="dp")``)."""
        for label in names:
            self._check_dim(label)
        labels = [names.get(label, label) for label in self.extent.labels]
        if len(set(labels)) != len(labels):
            raise DimensionError(f"rename({names}) gives two dimensions one name: {labels}")
        return Shape(Extent(labels, self.extent.sizes), self.ranks)

    def split(self, **spec: Any) -> Shape:
        """Splits dims into several (Monarch's ``split``): ``split(host=("dp", "pp"),
        pp=2)`` makes ``host`` into ``dp`` and ``pp`` of size 2 (one size per split
        may be left out: it is what remains)."""
        splits = {k: tuple(v) for k, v in spec.items() if isinstance(v, (tuple, list))}
        sizes_given = {k: v for k, v in spec.items() if isinstance(v, int) and not isinstance(v, bool)}
        for label in splits:
            self._check_dim(label)
        labels: list[str] = []
        sizes: list[int] = []
        for label, size in zip(self.extent.labels, self.extent.sizes):
            parts = splits.get(label, (label,))
            known = [sizes_given.get(p) for p in parts]
            if label not in splits:
                known = [size]
            missing = [i for i, k in enumerate(known) if k is None]
            fixed = math.prod(k for k in known if k is not None)
            if len(missing) > 1:
                raise DimensionError(f"split: give the sizes of all but one of {parts}")
            if missing:
                if size % fixed:
                    raise DimensionError(f"split: {label} has {size} procs, not a multiple of {fixed}")
                known[missing[0]] = size // fixed
            if math.prod(k for k in known if k is not None) != size:
                raise DimensionError(
                    f"split: {parts} of sizes {known} do not make the {size} procs of {label}"
                )
            labels.extend(parts)
            sizes.extend(int(k) for k in known if k is not None)
        unused = set(sizes_given) - set(labels)
        if unused:
            raise DimensionError(f"split: sizes given for dimensions that no split makes: {sorted(unused)}")
        if len(set(labels)) != len(labels):
            raise DimensionError(f"split gives two dimensions one name: {labels}")
        return Shape(Extent(labels, sizes), self.ranks)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shape) and self.extent == other.extent and self.ranks == other.ranks

    def __hash__(self) -> int:
        return hash((self.extent, self.ranks))

    def __repr__(self) -> str:
        return f"Shape({self.extent}, ranks={list(self.ranks)})"

    def __reduce__(self) -> Any:
        return (Shape, (self.extent, self.ranks))


class MeshTrait:
    """Slicing and size queries shared by proc meshes, actor meshes and value meshes.
    Subclasses provide ``_shape`` and ``_new_with_shape``."""

    _shape: Shape

    def _new_with_shape(self, shape: Shape) -> Any:
        raise NotImplementedError

    def slice(self, **kwargs: int | slice) -> Any:
        return self._new_with_shape(self._shape.slice(**kwargs))

    def flatten(self, name: str) -> Any:
        return self._new_with_shape(self._shape.flatten(name))

    def rename(self, **names: str) -> Any:
        """The same procs with dimensions renamed: ``rename(host="dp", gpu="tp")``."""
        return self._new_with_shape(self._shape.rename(**names))

    def split(self, **spec: Any) -> Any:
        """Dimensions split into several: ``split(host=("dp", "pp"), gpu=("tp",), pp=2)``."""
        return self._new_with_shape(self._shape.split(**spec))

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        return self._shape.size(dim)

    @property
    def sizes(self) -> dict[str, int]:
        return self._shape.sizes

    @property
    def extent(self) -> Extent:
        return self._shape.extent

    def __len__(self) -> int:
        return len(self._shape)
