"""ValueMesh: one value per point of a mesh, as call() returns it."""

from __future__ import annotations

import pickle

import cloudpickle
import pytest

from monarch_kernel import Extent, Point, Shape, ValueMesh


def _grid() -> ValueMesh[str]:
    """{hosts: 2, gpus: 3} holding "h<host>g<gpu>"."""
    return ValueMesh(Shape.of({"hosts": 2, "gpus": 3}), [f"h{h}g{g}" for h in range(2) for g in range(3)])


def test_values_are_in_rank_order():
    vm = ValueMesh(Shape.of({"procs": 4}), [10, 11, 12, 13])
    assert vm.values() == [10, 11, 12, 13]
    assert len(vm) == 4
    assert vm.extent == {"procs": 4}
    assert vm.sizes == {"procs": 4}


def test_values_returns_a_copy():
    vm = ValueMesh(Shape.of({"procs": 2}), [1, 2])
    vm.values().append(3)
    assert vm.values() == [1, 2]


def test_items_pair_each_point_with_its_value():
    vm = ValueMesh(Shape.of({"procs": 3}), ["a", "b", "c"])
    items = list(vm.items())
    assert [str(p) for p, _ in items] == ["{'procs': 0/3}", "{'procs': 1/3}", "{'procs': 2/3}"]
    assert [v for _, v in items] == ["a", "b", "c"]
    assert all(isinstance(p, Point) for p, _ in items)


def test_iterating_a_value_mesh_gives_its_items():
    vm = ValueMesh(Shape.of({"procs": 2}), ["a", "b"])
    assert [(p.rank, v) for p, v in vm] == [(0, "a"), (1, "b")]


def test_item_takes_a_coordinate_for_every_dimension():
    vm = _grid()
    assert vm.item(hosts=1, gpus=2) == "h1g2"
    assert vm.item(hosts=0, gpus=1) == "h0g1"


def test_item_without_every_dimension_raises_key_error():
    with pytest.raises(KeyError, match="gpus"):
        _grid().item(hosts=1)


def test_item_with_an_unknown_dimension_raises_key_error():
    with pytest.raises(KeyError, match="procs"):
        _grid().item(hosts=1, gpus=0, procs=0)


def test_item_of_a_zero_dimensional_mesh_takes_no_coordinate():
    vm = ValueMesh(Shape(Extent([], [])), ["only"])
    assert vm.item() == "only"


def test_get_reads_a_value_by_rank():
    assert _grid().get(4) == "h1g1"


def test_slicing_keeps_the_values_of_the_selected_points():
    vm = _grid()
    row = vm.slice(hosts=1)
    assert row.extent == {"gpus": 3}
    assert row.values() == ["h1g0", "h1g1", "h1g2"]
    col = vm.slice(gpus=slice(1, 3))
    assert col.extent == {"hosts": 2, "gpus": 2}
    assert col.values() == ["h0g1", "h0g2", "h1g1", "h1g2"]
    assert col.item(hosts=1, gpus=0) == "h1g1"


def test_slicing_a_sliced_value_mesh_selects_within_the_slice():
    vm = _grid().slice(gpus=slice(1, 3)).slice(hosts=0, gpus=1)
    assert vm.values() == ["h0g2"]
    assert vm.item() == "h0g2"


def test_flatten_lays_the_values_out_on_one_dimension():
    flat = _grid().flatten("all")
    assert flat.extent == {"all": 6}
    assert flat.item(all=4) == "h1g1"


def test_a_value_mesh_needs_one_value_per_point():
    with pytest.raises(ValueError, match="needs 4 values"):
        ValueMesh(Shape.of({"procs": 4}), [1, 2, 3])


def test_a_value_mesh_over_a_sliced_shape_is_indexed_from_zero():
    shape = Shape.of({"procs": 4}).slice(procs=slice(2, 4))
    vm = ValueMesh(shape, ["x", "y"])
    assert vm.item(procs=0) == "x"
    assert vm.item(procs=1) == "y"


def test_value_meshes_with_the_same_extent_and_values_are_equal():
    assert ValueMesh(Shape.of({"procs": 2}), [1, 2]) == ValueMesh(Shape.of({"procs": 2}), [1, 2])
    assert ValueMesh(Shape.of({"procs": 2}), [1, 2]) != ValueMesh(Shape.of({"procs": 2}), [2, 1])
    assert ValueMesh(Shape.of({"procs": 2}), [1, 2]) != ValueMesh(Shape.of({"gpus": 2}), [1, 2])


def test_repr_shows_the_extent_and_every_point():
    text = repr(ValueMesh(Shape.of({"procs": 2}), [12, 13]))
    assert text.startswith("ValueMesh({procs: 2})")
    assert "{'procs': 1/2}" in text and "13" in text


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_a_value_mesh_survives_pickling(dumps):
    vm = _grid().slice(gpus=slice(0, 2))
    back = pickle.loads(dumps(vm))
    assert back == vm
    assert back.item(hosts=1, gpus=1) == "h1g1"


def test_a_notebook_shows_a_large_value_mesh_grouped_by_value():
    import IPython.lib.pretty

    same = ValueMesh(Shape.of({"hosts": 64, "procs": 16}), [0.31] * 1023 + [float("nan")])
    assert IPython.lib.pretty.pretty(same).splitlines() == [
        "ValueMesh({hosts: 64, procs: 16}): 1,024 values, 2 distinct",
        "  [ranks 0-1022] 0.31",
        "  [rank 1023] nan",
    ]
    every = IPython.lib.pretty.pretty(ValueMesh(Shape.of({"procs": 1024}), list(range(1024)))).splitlines()
    assert every[0] == "ValueMesh({procs: 1024}): 1,024 values, 1,024 distinct"
    assert every[1:3] == ["  [rank 0] 0", "  [rank 1] 1"] and len(every) == 1 + 32 + 1
    assert every[-1] == "  ... and 992 more (.values() has them all, .item(...) one)"
    small = ValueMesh(Shape.of({"procs": 2}), [12, 13])  # a small one: its repr
    assert IPython.lib.pretty.pretty(small) == repr(small)
