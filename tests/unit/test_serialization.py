"""Message serialization: cloudpickle by value, out-of-band buffers, and the errors a
user sees when something cannot travel."""

from __future__ import annotations

import pickle
import threading

import pytest

from monarch_kernel import ActorError, Extent, Point
from monarch_kernel.errors import MessageTooLargeError, SerializationError
from monarch_kernel.mesh import _serial
from monarch_kernel.mesh._serial import dumps, loads


def _round_trip(obj):
    data, buffers = dumps(obj, "test value")
    return loads(data, buffers)


def test_plain_data_round_trips():
    obj = {"a": [1, 2.5, "three", None], "b": (b"bytes", {4, 5}), "c": True}
    assert _round_trip(obj) == obj


def test_a_class_defined_in_a_function_travels_by_value():
    class Local:
        def __init__(self, x):
            self.x = x

        def double(self):
            return self.x * 2

    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(Local)  # by reference, a local class cannot be found again
    data, buffers = dumps(Local, "a local class")
    cls = loads(data, buffers)
    assert cls(21).double() == 42


def test_lambdas_and_closures_travel_by_value():
    base = 10
    fns = _round_trip([lambda x: x + 1, lambda x: x + base])
    assert [f(1) for f in fns] == [2, 11]


def test_large_contiguous_arrays_travel_out_of_band():
    np = pytest.importorskip("numpy")
    a = np.arange(1 << 16, dtype=np.float64)
    data, buffers = dumps(a, "an array")
    assert len(buffers) == 1
    assert buffers[0].nbytes == a.nbytes
    assert len(data) < a.nbytes
    assert np.array_equal(loads(data, buffers), a)


class _Batch:
    """A user's object holding its data in an attribute."""

    def __init__(self, data):
        self.data = data


@pytest.mark.parametrize("kind", [bytes, bytearray])
@pytest.mark.parametrize(
    "where",
    [
        lambda big: big,
        lambda big: {"payload": [big]},
        lambda big: _Batch(big),  # an attribute: the pickler never walks into it for us
        lambda big: [[[[[[big]]]]]],  # deeper than any walk would go
        lambda big: {"k": _Batch((1, {"x": big}))},
    ],
    ids=["alone", "in a dict", "in an object", "deep", "in an object in a dict"],
)
def test_large_bytes_travel_out_of_band_wherever_they_are(kind, where):
    big = kind(b"\x01" * (1 << 17))
    data, buffers = dumps(where(big), "a value")
    assert len(data) < 4096 and [memoryview(b).nbytes for b in buffers] == [len(big)]
    back = loads(data, buffers)
    assert type(back) is type(where(big))
    assert pickle.dumps(back) == pickle.dumps(where(big))  # the same value, the same types


def test_small_bytes_and_a_large_bytes_met_twice_travel_once():
    big = b"\x02" * (1 << 17)
    data, buffers = dumps({"a": big, "b": [big], "small": b"tiny"}, "a value")
    assert [memoryview(b).nbytes for b in buffers] == [len(big)]
    back = loads(data, buffers)
    assert back["a"] is back["b"][0] and back["a"] == big and back["small"] == b"tiny"


def test_arrays_that_are_not_c_contiguous_still_round_trip():
    np = pytest.importorskip("numpy")
    fortran = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    strided = np.arange(20)[::3]
    back = _round_trip([fortran, strided])
    assert np.array_equal(back[0], fortran)
    assert np.array_equal(back[1], strided)


def test_tensors_round_trip():
    torch = pytest.importorskip("torch")
    t = torch.arange(1000, dtype=torch.float32).reshape(10, 100)
    assert torch.equal(_round_trip(t), t)


def test_an_unpicklable_value_raises_serialization_error_naming_what_was_sent():
    with pytest.raises(SerializationError, match="cannot pickle the arguments of counter.incr") as info:
        dumps(((threading.Lock(),), {}), "arguments of counter.incr")
    assert isinstance(info.value, TypeError)
    assert "lock" in str(info.value).lower()


def test_a_message_above_the_limit_raises_message_too_large_error(monkeypatch):
    monkeypatch.setattr(_serial, "MAX_MESSAGE_BYTES", 1000)
    with pytest.raises(MessageTooLargeError, match="arguments of big.put") as info:
        dumps(b"x" * 2000, "arguments of big.put")
    assert isinstance(info.value, ValueError)
    assert "1,000" in str(info.value)


def test_out_of_band_buffers_count_towards_the_limit(monkeypatch):
    np = pytest.importorskip("numpy")
    monkeypatch.setattr(_serial, "MAX_MESSAGE_BYTES", 4096)
    with pytest.raises(MessageTooLargeError):
        dumps(np.zeros(1024, dtype=np.float64), "an array")


def test_the_limit_is_the_native_core_limit():
    from monarch_kernel import _native

    assert _serial.MAX_MESSAGE_BYTES == _native.MAX_MESSAGE_BYTES > 0


def test_actor_error_survives_pickling_with_its_rank_and_traceback():
    rank = Point(2, Extent(["procs"], [4]))
    err = ActorError(
        ValueError("bad input"), "Actor call c.f failed.", "Traceback (most recent call last):\n  x", rank
    )
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, ActorError)
    assert back.rank == rank
    assert isinstance(back.exception, ValueError)
    assert str(back) == str(err)


def test_actor_error_str_names_the_call_the_rank_and_the_remote_traceback():
    rank = Point(2, Extent(["procs"], [4]))
    err = ActorError(None, "Actor call c.f failed.", "Traceback (most recent call last):\n  in f", rank)
    text = str(err)
    assert "Actor call c.f failed." in text
    assert "{'procs': 2/4}" in text
    assert "in f" in text
    assert "Traceback of where the remote call failed" in text


@pytest.mark.parametrize(
    "obj",
    [
        ((1, 2.5, "s", None, True), {}),
        ((b"x" * 100,), {"k": [1, 2, {"n": None}]}),
        ((b"y" * (1 << 17),), {}),  # big bytes: out of band, not the fast path
        (([1] * 100,), {}),  # long lists: cloudpickle
        (({1: "int key"},), {}),
    ],
)
def test_plain_and_not_so_plain_arguments_round_trip_the_same(obj):
    assert _round_trip(obj) == obj


def test_plain_data_takes_the_c_pickler_and_nothing_else_does():
    assert _serial._is_plain(((1, "a", b"b", None), {"x": 2.0}))
    assert not _serial._is_plain(((lambda: 1,), {}))
    assert not _serial._is_plain((bytes(1 << 17),))
    assert not _serial._is_plain(({1: 2},))  # only str keys
    assert not _serial._is_plain(((((((1,),),),),),))  # deep nesting


def test_a_plain_message_above_the_limit_still_raises(monkeypatch):
    monkeypatch.setattr(_serial, "MAX_MESSAGE_BYTES", 100)
    with pytest.raises(MessageTooLargeError, match="arguments of small.put"):
        dumps((("x" * 200,), {}), "arguments of small.put")
