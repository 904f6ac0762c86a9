"""The transfer engine end to end: every buffer kind and dtype through endpoints,
odd sizes, views, concurrency, TransferBuffer, failures, hostile frames, leaks."""

from __future__ import annotations

import gc
import hashlib
import os
import random
import signal
import socket
import threading
import time
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from proc_helpers import wait_for

from monarch_kernel import (
    Actor,
    SupervisionError,
    TransferBuffer,
    _native,
    endpoint,
    gather,
    scatter,
    this_host,
)
from monarch_kernel.mesh import _buffers, _serial

TIMEOUT = 60
BIG = _buffers.THRESHOLD * 4


class Store(Actor):
    def __init__(self) -> None:
        self.kept: object = None

    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    def keep(self, x: object) -> int:
        self.kept = x
        return os.getpid()

    @endpoint
    def summed(self, t: torch.Tensor) -> float:
        return float(t.double().sum())

    @endpoint
    def stats(self) -> dict:
        return _native.xfer_stats()

    @endpoint
    def make_buffer(self, n: int) -> TransferBuffer:
        self.kept = torch.arange(n, dtype=torch.float32)
        return TransferBuffer(self.kept)

    @endpoint
    def read_from(self, buf: TransferBuffer) -> float:
        dst = torch.empty(buf.nbytes // 4, dtype=torch.float32)
        buf.read_into(dst).get(timeout=TIMEOUT)
        return float(dst.sum())

    @endpoint
    def write_to(self, buf: TransferBuffer, value: float) -> None:
        buf.write_from(torch.full((buf.nbytes // 4,), value, dtype=torch.float32)).get(timeout=TIMEOUT)

    @endpoint
    def kept_sum(self) -> float:
        return float(self.kept.sum())  # type: ignore[attr-defined]

    @endpoint
    def exit_during(self, x: object) -> None:
        os._exit(7)

    @endpoint
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def kept_value(self) -> object:
        return self.kept

    @endpoint
    def bump(self) -> None:
        self.kept.add_(1)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def store(procs2):
    return procs2.spawn("store", Store)


def _one(store):
    return store.slice(procs=1)


DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int64,
    torch.bool,
    torch.complex64,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [0, 1, 7, BIG + 3], ids=lambda n: f"n{n}")
def test_tensors_of_every_dtype_and_size_come_back_equal(store, dtype, n):
    t = (torch.arange(n) % 3).to(dtype)
    r = _one(store).echo.call_one(t).get(timeout=TIMEOUT)
    assert r.dtype == t.dtype and r.shape == t.shape and torch.equal(r, t)


def test_views_keep_their_strides_and_values(store):
    base = torch.arange(BIG, dtype=torch.float32).reshape(-1, 64)
    for view in (base[:, ::2], base.t(), base[10:20], base[::3, 5:9]):
        r = _one(store).echo.call_one(view).get(timeout=TIMEOUT)
        assert r.stride() == view.stride() and torch.equal(r, view)


def test_parameters_and_requires_grad_survive(store):
    p = torch.nn.Parameter(torch.ones(BIG // 4))
    r = _one(store).echo.call_one(p).get(timeout=TIMEOUT)
    assert isinstance(r, torch.nn.Parameter) and r.requires_grad and torch.equal(r, p)


@pytest.mark.parametrize(
    "make",
    [
        lambda: bytes(random.randbytes(BIG)),
        lambda: bytearray(random.randbytes(BIG)),
        lambda: np.arange(BIG, dtype=np.int32),
        lambda: np.asfortranarray(np.arange(BIG, dtype=np.float64).reshape(-1, 8)),
        lambda: b"",
        lambda: bytearray(3),
    ],
    ids=["bytes", "bytearray", "ndarray", "fortran", "empty-bytes", "odd-bytearray"],
)
def test_buffers_of_every_kind_come_back_equal(store, make):
    x = make()
    r = _one(store).echo.call_one(x).get(timeout=TIMEOUT)
    assert type(r) is type(x)
    if isinstance(x, np.ndarray):
        assert np.array_equal(r, x)
    else:
        assert r == x


def test_memoryviews_travel_as_memoryviews(store):
    m = memoryview(np.arange(BIG, dtype=np.int16))
    r = _one(store).echo.call_one(m).get(timeout=TIMEOUT)
    assert isinstance(r, memoryview) and r.format == "h" and r.tolist() == m.tolist()


def test_large_buffers_go_through_the_engine_and_nothing_stays_registered(store):
    before = _one(store).stats.call_one().get(timeout=TIMEOUT)
    t = torch.randn(1 << 20)
    for _ in range(3):
        assert torch.equal(_one(store).echo.call_one(t).get(timeout=TIMEOUT), t)
    after = _one(store).stats.call_one().get(timeout=TIMEOUT)
    assert after["bytes_local"] - before["bytes_local"] >= 3 * t.nbytes
    assert after["registered"] == 0 and _native.xfer_stats()["registered"] == 0
    # A broadcast registers once for every rank, and every rank releases.
    store.keep.call(t).get(timeout=TIMEOUT)
    assert _native.xfer_stats()["registered"] == 0


def test_concurrent_transfers_do_not_mix(store):
    tensors = [torch.full((BIG,), float(i)) for i in range(16)]
    futures = [_one(store).summed.call_one(t) for t in tensors]
    assert [f.get(timeout=TIMEOUT) for f in futures] == [float(i) * BIG for i in range(16)]
    results: list[bool] = []

    def hammer(i: int) -> None:
        t = torch.full((BIG + i,), float(i))
        results.append(torch.equal(_one(store).echo.call_one(t).get(timeout=TIMEOUT), t))

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == [True] * 6


def test_lazy_views_and_other_tensor_kinds_arrive_as_they_are(store):
    one = _one(store)
    z = torch.randn(BIG, dtype=torch.complex64)
    assert torch.equal(one.echo.call_one(z.conj()).get(timeout=TIMEOUT), z.conj().resolve_conj())
    assert torch.equal(one.echo.call_one(-z).get(timeout=TIMEOUT), -z)
    sparse = torch.eye(300).to_sparse()
    back = one.echo.call_one(sparse).get(timeout=TIMEOUT)
    assert back.is_sparse and torch.equal(back.to_dense(), torch.eye(300))
    with warnings.catch_warnings():  # torch deprecates quantized dtypes; they still pickle
        warnings.simplefilter("ignore", UserWarning)
        q = torch.quantize_per_tensor(torch.randn(BIG), 0.1, 0, torch.qint8)
    qback = one.echo.call_one(q).get(timeout=TIMEOUT)
    assert qback.is_quantized and torch.equal(qback.int_repr(), q.int_repr())


def test_a_transfer_buffer_of_fortran_order_memory_says_what_to_do():
    with pytest.raises(ValueError, match="ascontiguousarray"):
        TransferBuffer(np.asfortranarray(np.ones((300, 300))))


def test_a_call_carries_its_tensors_as_they_were_when_it_was_made(store):
    one = _one(store)
    busy = one.nap.call_one(0.5)  # the call below waits its turn behind this one
    t = torch.zeros(BIG)
    queued = one.summed.call_one(t)
    t.fill_(1.0)  # after the call was made: the worker must not see it
    busy.get(timeout=TIMEOUT)
    assert queued.get(timeout=TIMEOUT) == 0.0
    # The same for a broadcast, which has no reply to wait for.
    busy = one.nap.call_one(0.5)
    b = torch.zeros(BIG)
    one.keep.broadcast(b)
    b.fill_(1.0)
    busy.get(timeout=TIMEOUT)
    assert one.kept_sum.call_one().get(timeout=TIMEOUT) == 0.0


def test_a_return_value_is_what_the_endpoint_returned_even_if_the_actor_changes_it_next(store):
    one = _one(store)
    one.keep.call_one(torch.zeros(BIG)).get(timeout=TIMEOUT)
    before = one.kept_value.call_one()  # not waited for yet
    one.bump.call_one().get(timeout=TIMEOUT)  # changes the kept tensor in place
    assert float(before.get(timeout=TIMEOUT).sum()) == 0.0
    assert one.kept_sum.call_one().get(timeout=TIMEOUT) == float(BIG)
    assert _native.xfer_stats()["registered"] == 0


def test_what_was_pulled_for_replies_nobody_takes_is_freed(store):
    one = _one(store)
    one.keep.call_one(torch.ones(BIG)).get(timeout=TIMEOUT)
    futures = [one.kept_value.call_one() for _ in range(3)]
    deadline = time.monotonic() + 10
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.05)
    del futures  # never get(): their replies were pulled as they arrived, and go now
    gc.collect()
    assert wait_for(lambda: _native.xfer_stats()["prefetched"] == 0)
    late = one.kept_value.call_one()
    del late  # dropped before its reply arrives: freed when it does
    gc.collect()
    time.sleep(0.5)
    assert wait_for(lambda: _native.xfer_stats()["prefetched"] == 0)
    assert one.stats.call_one().get(timeout=TIMEOUT)["prefetched"] == 0


def test_a_tcp_fetch_works_where_direct_reads_are_not_possible(monkeypatch):
    data = bytearray(random.randbytes(9 << 20))
    desc = _native.xfer_register(data, "tok-tcp", 1)
    forged = bytearray(desc)
    forged[5:21] = bytes(16)  # another host: the engine must use TCP
    before = _native.xfer_stats()["bytes_tcp"]
    got = _native.Descriptor(forged).fetch_new("tok-tcp", 3)
    assert bytes(memoryview(got)) == bytes(data)
    assert _native.xfer_stats()["bytes_tcp"] - before == len(data)


class Reader(Actor):
    @endpoint
    def read(self, buf: TransferBuffer) -> tuple[bytes, int]:
        dst = bytearray(buf.nbytes)
        buf.read_into(dst).get(timeout=TIMEOUT)
        return bytes(dst[:64]) + bytes(dst[-64:]), _native.xfer_stats()["bytes_tcp"]


def test_the_tcp_path_can_be_forced_on_one_host(state_home):
    procs = this_host().spawn_procs(per_host={"procs": 1}, env={"MONARCH_TRANSFER_TCP": "1"})
    try:
        data = bytearray(random.randbytes(5 << 20))
        buf = TransferBuffer(data)
        ends, tcp_bytes = procs.spawn("r", Reader).read.call_one(buf).get(timeout=TIMEOUT)
        assert ends == bytes(data[:64]) + bytes(data[-64:]) and tcp_bytes >= len(data)
        buf.drop()
    finally:
        procs.stop()


def test_a_descriptor_is_decoded_once_travels_as_its_bytes_and_pickles():
    import pickle

    data = bytearray(random.randbytes(1000))
    desc = _native.xfer_register(data, "tok-desc", 0)
    try:
        assert desc.len == 1000 and desc.addr == _native.xfer_stats()["addr"]
        assert desc.token_id == hashlib.sha256(b"tok-desc").digest()
        wire = bytes(desc)
        assert bytes(memoryview(desc)) == wire and memoryview(desc).readonly
        assert _native.Descriptor(bytearray(wire)) == desc  # as a message's buffer arrives
        back = pickle.loads(pickle.dumps(desc))
        assert back == desc and hash(back) == hash(desc) and back.id == desc.id
        assert bytes(memoryview(back.fetch_new("tok-desc"))) == bytes(data)
        with pytest.raises(ValueError, match="malformed"):
            _native.Descriptor(wire[:-1])
    finally:
        assert _native.xfer_drop(desc.id)


def test_a_wrong_token_is_refused_and_counted():
    desc = _native.xfer_register(bytearray(BIG), "right-token", 0)
    with pytest.raises(ValueError, match="another mesh"):
        desc.fetch_new("wrong-token")
    host, port = _native.xfer_stats()["addr"].rsplit(":", 1)
    denied = _native.xfer_stats()["denied"]
    with socket.create_connection((host, int(port))) as s:
        s.recv(32)
        s.sendall((65).to_bytes(4, "little") + bytes([1]) + bytes(64))  # a Hello with a bad MAC
        assert s.recv(9)[0] == 3  # Denied
    assert _native.xfer_stats()["denied"] == denied + 1
    assert _native.xfer_drop(desc.id)


def test_ten_thousand_random_frames_never_crash_the_engine():
    host, port = _native.xfer_stats()["addr"].rsplit(":", 1)
    rng = random.Random(1234)
    rejected = _native.xfer_stats()["rejected_frames"] + _native.xfer_stats()["denied"]
    sent = 0
    while sent < 10_000:
        with socket.create_connection((host, int(port))) as s:
            s.settimeout(5)
            s.recv(32)
            for _ in range(50):
                n = rng.choice([0, 1, 4, 9, 25, 65, 1024, 1025, 1 << 31, rng.randrange(1 << 32)])
                body = rng.randbytes(rng.randrange(0, 80))
                try:
                    s.sendall(n.to_bytes(4, "little") + body)
                except OSError:
                    break  # the engine closed the connection: as it should
                sent += 1
    # The engine still serves real transfers.
    data = bytearray(random.randbytes(BIG))
    desc = _native.xfer_register(data, "after-fuzz", 1)
    forged = bytearray(desc)
    forged[5:21] = bytes(16)
    assert bytes(memoryview(_native.Descriptor(forged).fetch_new("after-fuzz"))) == bytes(data)
    assert _native.xfer_stats()["rejected_frames"] + _native.xfer_stats()["denied"] > rejected


def test_transfer_buffers_read_and_write_across_processes(store):
    one = _one(store)
    remote = one.make_buffer.call_one(BIG).get(timeout=TIMEOUT)
    dst = torch.empty(BIG, dtype=torch.float32)
    remote.read_into(dst).get(timeout=TIMEOUT)
    assert torch.equal(dst, torch.arange(BIG, dtype=torch.float32))
    remote.write_from(torch.full((BIG,), 2.0)).get(timeout=TIMEOUT)
    assert one.kept_sum.call_one().get(timeout=TIMEOUT) == 2.0 * BIG
    mine = torch.ones(BIG, dtype=torch.float32)
    buf = TransferBuffer(mine)
    assert one.read_from.call_one(buf).get(timeout=TIMEOUT) == float(BIG)
    one.write_to.call_one(buf, 3.0).get(timeout=TIMEOUT)
    assert float(mine.sum()) == 3.0 * BIG
    buf.drop()
    with pytest.raises(RuntimeError, match="dropped"):
        buf.read_into(torch.empty(BIG))


class Trainer(Actor):
    """Reads weights from a parameter server on another mesh (Monarch's getting-started
    "Point-to-Point RDMA" section)."""

    @endpoint
    def pull(self, server: Any, n: int) -> float:
        buf = server.make_buffer.call_one(n).get(timeout=TIMEOUT)  # made on the other mesh
        dst = torch.empty(n, dtype=torch.float32)
        buf.read_into(dst).get(timeout=TIMEOUT)
        return float(dst.sum())


def test_a_transfer_buffer_is_read_and_written_from_another_mesh(store, fresh_procs1):
    # XFER-6: the handle is the permission, not membership of the owner's mesh.
    one = _one(store)
    other = fresh_procs1.spawn("other", Store)
    remote = one.make_buffer.call_one(BIG).get(timeout=TIMEOUT)  # owned by a proc of the first mesh
    assert other.read_from.call_one(remote).get(timeout=TIMEOUT) == float(sum(range(BIG)))
    other.write_to.call_one(remote, 5.0).get(timeout=TIMEOUT)
    assert one.kept_sum.call_one().get(timeout=TIMEOUT) == 5.0 * BIG
    remote.drop()
    trainer = fresh_procs1.spawn("trainer", Trainer)
    assert trainer.pull.call_one(one, 1000).get(timeout=TIMEOUT) == float(sum(range(1000)))
    mine = TransferBuffer(torch.ones(10, dtype=torch.float32))  # the controller's, read by both meshes
    assert other.read_from.call_one(mine).get(timeout=TIMEOUT) == 10.0
    assert one.read_from.call_one(mine).get(timeout=TIMEOUT) == 10.0
    mine.drop()


def test_gather_and_scatter(store):
    shards = scatter(store.echo, torch.arange(10.0)).get(timeout=TIMEOUT)
    assert [s.tolist() for s in shards.values()] == [[0.0, 1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0, 9.0]]
    stacked = gather(store.echo.call(torch.ones(3)).get(timeout=TIMEOUT), stack=True)
    assert stacked.shape == (2, 3)


@pytest.mark.slow
def test_a_sender_dying_mid_transfer_is_a_clear_error_and_nothing_hangs(state_home):
    procs = this_host().spawn_procs(per_host={"procs": 1})
    procs.on_failure(lambda f: None)
    try:
        s = procs.spawn("s", Store)
        pid = s.keep.call_one(None).get(timeout=TIMEOUT)
        big = s.make_buffer.call_one(64 << 20).get(timeout=TIMEOUT)  # 256 MiB held by the worker
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        dst = torch.empty(64 << 20, dtype=torch.float32)
        with pytest.raises(_native.TransferError):
            big.read_into(dst).get(timeout=TIMEOUT)
        with pytest.raises(SupervisionError):
            s.exit_during.call_one(torch.ones(BIG)).get(timeout=TIMEOUT)
    finally:
        procs.stop()
    assert _native.xfer_stats()["registered"] == 0


def test_without_a_token_large_buffers_stay_inline():
    data, raws = _serial.dumps(torch.ones(BIG), "test")
    assert data[:4] != _buffers.HEADER and memoryview(raws[0]).nbytes == BIG * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_tensor_arrives_on_the_same_device(store):
    # The workers see the controller's GPUs: CUDA IPC there, and back (GPU-1).
    t = torch.arange(BIG, dtype=torch.float32, device="cuda")
    r = _one(store).echo.call_one(t).get(timeout=TIMEOUT)
    assert r.device == t.device and torch.equal(r, t)
    assert r.data_ptr() != t.data_ptr()  # a copy of its own, not the sender's memory
    view = torch.arange(64 * 1024, dtype=torch.float64, device="cuda").reshape(256, 256)[::2, 1::3]
    back = _one(store).echo.call_one(view).get(timeout=TIMEOUT)
    assert back.device == view.device and torch.equal(back, view)
    p = torch.nn.Parameter(torch.ones(BIG, device="cuda"))
    got = _one(store).echo.call_one(p).get(timeout=TIMEOUT)
    assert isinstance(got, torch.nn.Parameter) and got.requires_grad and got.is_cuda
    assert _native.xfer_stats()["registered"] == 0  # the staged copies ended with the calls


class Gpu(Actor):
    @endpoint
    def take(self, t: torch.Tensor) -> tuple[str, float, str]:
        return str(t.device), float(t.sum().item()), str(torch.cuda.get_device_properties(t.device).uuid)

    @endpoint
    def make(self, n: int) -> torch.Tensor:
        return torch.ones(n, device="cuda") * (1 + int(os.environ["MONARCH_RANK"]))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_procs_get_cuda_tensors_through_ipc_or_the_staged_copy(state_home):
    # Rank 0 sees GPU 0 (the tensor's: IPC); rank 1 sees only GPU 1 (the staged copy,
    # arriving on its own cuda:0). Replies come back over IPC to the right GPU.
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        g = procs.spawn("gpu", Gpu)
        t = torch.ones(BIG, device="cuda:0")
        got = list(g.take.call(t).get(timeout=TIMEOUT).values())
        assert [d for d, _s, _u in got] == ["cuda:0", "cuda:0"] and {s for _d, s, _u in got} == {float(BIG)}
        uuids = [u for _d, _s, u in got]
        assert uuids[0] == str(torch.cuda.get_device_properties(0).uuid) and uuids[1] != uuids[0]
        made = list(g.make.call(BIG).get(timeout=TIMEOUT).values())
        assert [m.device for m in made] == [torch.device("cuda:0"), torch.device("cuda:1")]
        assert [float(m[0]) for m in made] == [1.0, 2.0]
    finally:
        procs.stop()


def test_a_recorded_handshake_cannot_be_replayed():
    import hmac

    token = "replay-token"
    desc = _native.xfer_register(bytearray(16), token, 0)  # makes the engine know the token
    host, port = _native.xfer_stats()["addr"].rsplit(":", 1)
    tid = hashlib.sha256(token.encode()).digest()

    def hello(nonce: bytes) -> bytes:
        body = bytes([1]) + tid + hmac.new(token.encode(), nonce, hashlib.sha256).digest()
        return len(body).to_bytes(4, "little") + body

    with socket.create_connection((host, int(port))) as s:
        recorded = hello(s.recv(32))
        s.sendall(recorded)
        assert s.recv(9)[0] == 0  # accepted
    denied = _native.xfer_stats()["denied"]
    with socket.create_connection((host, int(port))) as s:
        s.recv(32)  # a fresh nonce
        s.sendall(recorded)
        assert s.recv(9)[0] == 3  # Denied
    assert _native.xfer_stats()["denied"] == denied + 1
    assert _native.xfer_drop(desc.id)


def test_waiting_for_readers_ends_when_they_read_or_a_receiver_is_gone():
    desc = _native.xfer_register(bytearray(BIG), "tok-wait", 1)
    reader = threading.Timer(0.2, lambda: desc.fetch_new("tok-wait"))
    reader.start()
    assert _native.xfer_wait_read([desc.id], [], TIMEOUT) is True
    reader.join()
    unread = _native.xfer_register(bytearray(16), "tok-wait", 1)
    try:
        assert _native.xfer_wait_read([unread.id], [], TIMEOUT, lambda: True) is False
        assert _native.xfer_wait_read([unread.id], [], 0.05) is False
    finally:
        assert _native.xfer_drop(unread.id)


def test_waiting_for_readers_lets_an_interrupt_in():
    unread = _native.xfer_register(bytearray(16), "tok-interrupt", 1)
    interrupt = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    interrupt.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _buffers.wait_read([unread.id], limit=TIMEOUT)
    finally:
        interrupt.cancel()
        assert _native.xfer_drop(unread.id)


def test_waiting_for_readers_ends_when_a_receivers_connection_is_lost(state_home):
    procs = this_host().spawn_procs(per_host={"procs": 1})
    procs.on_failure(lambda f: None)
    unread = _native.xfer_register(bytearray(16), "tok-lost", 1)  # nobody will read it
    try:
        s = procs.spawn("s", Store)
        pid = s.keep.call_one(None).get(timeout=TIMEOUT)
        pending = s.nap.call_one(10 * TIMEOUT)
        threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
        started = time.monotonic()
        # No gone() here: the call's lost connection alone ends the wait.
        assert _native.xfer_wait_read([unread.id], pending._calls, 10 * TIMEOUT) is False
        assert time.monotonic() - started < TIMEOUT  # long before the limit
    finally:
        _native.xfer_drop(unread.id)
        procs.stop()


def test_the_wire_formats_python_uses_are_the_native_engines():
    assert _buffers.HEADER is _native.MESSAGE_HEADER and _buffers.HEADER == b"\x00MKX"
    assert _native.TRANSFER_STREAMS_ENV == "MONARCH_TRANSFER_STREAMS"
    expected = int(os.environ.get("MONARCH_TRANSFER_STREAMS", _native.DEFAULT_TRANSFER_STREAMS))
    assert _buffers.STREAMS == expected and _native.DEFAULT_TRANSFER_STREAMS >= 1


class Parcel:
    """A user's object that holds its data in an attribute (the pickler walks into it
    only by its own reduction: bytes there were written inline)."""

    def __init__(self, data: object) -> None:
        self.data = data


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_large_bytes_in_a_users_object_go_through_the_engine_both_ways(store, kind):
    big = kind(b"\x03" * (4 << 20))
    before = _native.xfer_stats()["bytes_local"]  # what this process pulled: the replies
    remote_before = _one(store).stats.call_one().get(timeout=TIMEOUT)["bytes_local"]
    r = _one(store).echo.call_one(Parcel({"inner": {big}} if kind is bytes else [big])).get(timeout=TIMEOUT)
    got = next(iter(r.data["inner"])) if kind is bytes else r.data[0]
    assert type(got) is kind and got == big
    assert _one(store).stats.call_one().get(timeout=TIMEOUT)["bytes_local"] - remote_before >= len(big)
    assert _native.xfer_stats()["bytes_local"] - before >= len(big)  # the reply too


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_large_bytes_go_through_the_engine_not_the_message(store, kind):
    # CPython's pickler writes bytes inline without asking reducer_override: a bytes
    # argument above the message limit failed with MessageTooLargeError.
    big = kind(bytes(300 << 20) + b"\x01")  # above the message limit; one byte marks the end
    before = _one(store).stats.call_one().get(timeout=TIMEOUT)
    nested = {"payload": [big], "n": 1}
    r = _one(store).echo.call_one(nested).get(timeout=120)
    assert (
        type(r["payload"][0]) is kind and len(r["payload"][0]) == len(big) and r["payload"][0][-1:] == b"\x01"
    )
    after = _one(store).stats.call_one().get(timeout=TIMEOUT)
    assert after["bytes_local"] - before["bytes_local"] >= len(big)  # pulled, not in a message
