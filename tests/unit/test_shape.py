"""Extent, Point and Shape: named dimensions, coordinates and slicing."""

from __future__ import annotations

import pickle

import cloudpickle
import pytest

from monarch_kernel import Extent, Point, Shape
from monarch_kernel.errors import DimensionError, MeshIndexError


def test_extent_is_a_read_only_mapping_of_label_to_size():
    e = Extent(["hosts", "gpus"], [2, 4])
    assert dict(e) == {"hosts": 2, "gpus": 4}
    assert list(e) == ["hosts", "gpus"]
    assert e["gpus"] == 4
    assert len(e) == 2
    assert e.nelements == 8
    with pytest.raises(KeyError):
        e["procs"]


def test_extent_prints_like_monarch():
    assert str(Extent(["hosts", "gpus"], [2, 4])) == "{hosts: 2, gpus: 4}"


def test_extent_equals_an_extent_or_a_dict_with_the_same_sizes():
    assert Extent(["procs"], [4]) == Extent(["procs"], [4])
    assert Extent(["procs"], [4]) == {"procs": 4}
    assert Extent(["procs"], [4]) != Extent(["procs"], [3])
    assert Extent(["a", "b"], [1, 2]) != Extent(["b", "a"], [2, 1])
    assert hash(Extent(["procs"], [4])) == hash(Extent(["procs"], [4]))


def test_extent_with_more_labels_than_sizes_is_refused():
    with pytest.raises(ValueError):
        Extent(["a", "b"], [1])


def test_empty_extent_has_one_element():
    assert Extent([], []).nelements == 1


def test_point_prints_its_coordinate_and_size_per_dimension():
    assert str(Point(1, Extent(["procs"], [4]))) == "{'procs': 1/4}"
    assert str(Point(5, Extent(["hosts", "gpus"], [2, 4]))) == "{'hosts': 1/2, 'gpus': 1/4}"


def test_point_coordinates_are_row_major():
    e = Extent(["hosts", "gpus"], [2, 4])
    assert dict(Point(0, e)) == {"hosts": 0, "gpus": 0}
    assert dict(Point(3, e)) == {"hosts": 0, "gpus": 3}
    assert dict(Point(6, e)) == {"hosts": 1, "gpus": 2}
    assert Point(6, e).rank == 6
    assert Point(6, e).size("gpus") == 4
    assert Point(6, e).extent is e


def test_point_equals_a_point_at_the_same_rank_of_the_same_extent():
    e = Extent(["procs"], [4])
    assert Point(2, e) == Point(2, Extent(["procs"], [4]))
    assert Point(2, e) != Point(1, e)
    assert Point(2, e) == {"procs": 2}
    assert len({Point(2, e), Point(2, Extent(["procs"], [4]))}) == 1


def test_point_of_an_empty_extent_has_no_coordinates():
    p = Point(0, Extent([], []))
    assert dict(p) == {}
    assert str(p) == "{}"


def test_shape_of_a_dict_covers_every_rank_in_order():
    s = Shape.of({"hosts": 2, "gpus": 3})
    assert s.labels == ("hosts", "gpus")
    assert s.sizes == {"hosts": 2, "gpus": 3}
    assert s.ranks == tuple(range(6))
    assert len(s) == 6
    assert [p.rank for p in s.points()] == list(range(6))


def test_shape_size_counts_all_or_some_dimensions():
    s = Shape.of({"hosts": 2, "gpus": 3})
    assert s.size() == 6
    assert s.size("gpus") == 3
    assert s.size(["hosts", "gpus"]) == 6


def test_slicing_with_an_int_removes_the_dimension():
    s = Shape.of({"hosts": 2, "gpus": 4}).slice(hosts=1)
    assert s.labels == ("gpus",)
    assert s.ranks == (4, 5, 6, 7)


def test_slicing_with_a_python_slice_keeps_the_dimension():
    s = Shape.of({"procs": 8})
    assert s.slice(procs=slice(2, 5)).sizes == {"procs": 3}
    assert s.slice(procs=slice(2, 5)).ranks == (2, 3, 4)
    assert s.slice(procs=slice(None, None, 3)).ranks == (0, 3, 6)


def test_slicing_every_dimension_with_ints_leaves_one_point():
    s = Shape.of({"hosts": 2, "gpus": 4}).slice(hosts=1, gpus=2)
    assert s.labels == ()
    assert s.ranks == (6,)
    assert len(s) == 1


def test_slicing_a_slice_keeps_the_base_ranks():
    s = Shape.of({"hosts": 2, "gpus": 4}).slice(gpus=slice(1, 4)).slice(hosts=1, gpus=slice(1, None))
    assert s.sizes == {"gpus": 2}
    assert s.ranks == (6, 7)


def test_flatten_puts_every_rank_on_one_named_dimension():
    s = Shape.of({"hosts": 2, "gpus": 4}).slice(gpus=slice(0, 2)).flatten("all")
    assert s.sizes == {"all": 4}
    assert s.ranks == (0, 1, 4, 5)


def test_slicing_an_unknown_dimension_raises_dimension_error_naming_the_dimensions():
    with pytest.raises(DimensionError, match="'gpus'") as info:
        Shape.of({"procs": 4}).slice(gpus=0)
    assert isinstance(info.value, TypeError)
    assert "procs" in str(info.value)


def test_size_of_an_unknown_dimension_raises_dimension_error():
    with pytest.raises(DimensionError):
        Shape.of({"procs": 4}).size("gpus")


def test_slicing_with_an_index_out_of_range_raises_mesh_index_error():
    with pytest.raises(MeshIndexError, match="out of range") as info:
        Shape.of({"procs": 4}).slice(procs=4)
    assert isinstance(info.value, IndexError)


@pytest.mark.parametrize("bad", ["1", 1.0, True, [1]])
def test_slicing_with_something_other_than_an_int_or_slice_raises_dimension_error(bad):
    with pytest.raises(DimensionError):
        Shape.of({"procs": 4}).slice(procs=bad)


def test_shape_with_the_wrong_number_of_ranks_is_refused():
    with pytest.raises(ValueError):
        Shape(Extent(["procs"], [4]), [0, 1])


def test_shapes_are_equal_when_extent_and_ranks_are():
    a = Shape.of({"procs": 4}).slice(procs=slice(1, 3))
    b = Shape(Extent(["procs"], [2]), [1, 2])
    assert a == b
    assert hash(a) == hash(b)
    assert a != Shape.of({"procs": 2})


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_extent_point_and_shape_survive_pickling(dumps):
    e = Extent(["hosts", "gpus"], [2, 4])
    s = Shape.of({"hosts": 2, "gpus": 4}).slice(gpus=slice(1, 3))
    assert pickle.loads(dumps(e)) == e
    assert pickle.loads(dumps(Point(5, e))) == Point(5, e)
    assert pickle.loads(dumps(s)) == s
