"""How buffers travel: tensors, bytes and memoryviews become out-of-band pickle
buffers, and large out-of-band buffers go through the transfer engine (the data
plane) instead of the gRPC message.

A message whose buffers went through the engine starts with ``HEADER`` and the
indices of those buffers; at those indices the message carries descriptors. The
receiver pulls each into a buffer from the native pool of huge-page mappings
(``RecvBuffer``) with the GIL released; tensors and arrays are then built on that
memory without another copy.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
import sys
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from monarch_kernel import _native
from monarch_kernel.mesh._role import here

#: Buffers at least this large go through the engine (MONARCH_TRANSFER_THRESHOLD).
THRESHOLD = int(os.environ.get("MONARCH_TRANSFER_THRESHOLD", 64 * 1024))
#: Parallel TCP streams per transfer across hosts (MONARCH_TRANSFER_STREAMS; the
#: name and the default are the native engine's).
STREAMS = int(os.environ.get(_native.TRANSFER_STREAMS_ENV, _native.DEFAULT_TRANSFER_STREAMS))
#: Seconds a registration waits for its readers before it is dropped anyway.
TTL = 300.0
#: How a message whose buffers went through the engine starts (parsed natively).
HEADER = _native.MESSAGE_HEADER

#: The mesh token of the message being pickled (TransferBuffer registers under it).
current_token: ContextVar[str | None] = ContextVar("monarch_current_token", default=None)


def calling_token() -> str | None:
    """The token of the mesh whose call is being pickled now (None outside one)."""
    return current_token.get()


#: How many receivers the message being pickled has, and where the ids of what its
#: reducers register go (so that they end with the call, XFER-1).
current_readers: ContextVar[tuple[int, list[int] | None]] = ContextVar(
    "monarch_current_readers", default=(1, None)
)


#: Tokens of the meshes this process talks to, by SHA-256: a descriptor finds its own.
_tokens: dict[bytes, str] = {}


def know_token(token: str) -> None:
    """Lets this process read buffers registered under ``token`` (its meshes' own)."""
    _tokens[hashlib.sha256(token.encode()).digest()] = token


def token_of(desc: _native.Descriptor) -> str:
    """The token of the mesh ``desc``'s buffer is registered under, if this process
    knows it (it controls or belongs to that mesh)."""
    own = here.token
    if own is not None:
        know_token(own)
    token = _tokens.get(desc.token_id)
    if token is None:
        raise RuntimeError("this TransferBuffer belongs to a mesh this process is not part of")
    return token


def prefer_huge_pages() -> None:
    """PyTorch's CPU allocator puts tensors of 2 MiB or more on transparent huge pages
    when ``THP_MEM_ALLOC_ENABLE=1`` (opt-in in torch). The engine reads such memory
    about 1.4 times faster (fewer pages to pin), and memcpy gains too. The kernel and
    the workers turn it on at start unless the user set it (``=0`` keeps it off)."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def send_remote(raws: list[Any], token: str, readers: int) -> tuple[bytes, list[Any], list[int], list[int]]:
    """Registers the large buffers of ``raws``; returns (header, new raws, the indices
    replaced by descriptors, their registration ids)."""
    remote, ids = [], []
    out = list(raws)
    for i, r in enumerate(raws):
        if memoryview(r).nbytes >= THRESHOLD:
            desc = _native.xfer_register(r, token, readers, TTL)
            out[i] = desc  # travels as its wire form (buffer protocol)
            remote.append(i)
            ids.append(desc.id)
    if not remote:
        return b"", raws, [], []
    return HEADER + struct.pack(f"<I{len(remote)}I", len(remote), *remote), out, remote, ids


def drop_now(ids: list[int]) -> None:
    """Ends the registrations ``ids`` at once (their message was never sent)."""
    for i in ids:
        _native.xfer_drop(i)


def drop_when_done(calls: Sequence[Any], ids: list[int]) -> None:
    """XFER-1 for calls: once every call has its reply (or failed), the receivers are
    done with the registrations ``ids``, released or not (a receiver that died never
    releases): they end. Hooked on the calls in native code; no Python runs then."""
    if ids:  # (most calls register nothing: no crossing into native code for them)
        _native.xfer_drop_when_done(calls, ids)


def wait_read(
    ids: list[int],
    calls: Sequence[Any] | None = None,
    limit: float | None = None,
    gone: Callable[[], bool] | None = None,
) -> None:
    """XFER-2: returns once the receivers have read the registrations ``ids`` (they
    pull a message's buffers as it arrives), so that the sender may then change the
    memory without changing what it sent; or once ``calls`` (if any) have all ended
    or one of their connections is lost (a dead receiver never reads; stopping a mesh
    closes its connections), or ``gone()`` says a receiver died (a broadcast has no
    calls to watch), or after ``limit`` seconds.

    The wait is native, with the GIL released; every 50 ms it takes the GIL back for
    a moment to let an interrupt in (raising KeyboardInterrupt here) and to ask
    ``gone()``."""
    if ids:
        _native.xfer_wait_read(ids, calls or [], limit, gone)


def receive_remote(data: Any, buffers: list[Any], token: str | None) -> tuple[Any, list[Any]]:
    """Undoes :func:`send_remote` on the receiving side: pulls every remote buffer."""
    view = memoryview(data)
    if view[:4] != HEADER:
        return data, buffers
    (count,) = struct.unpack_from("<I", view, 4)
    indices = struct.unpack_from(f"<{count}I", view, 8)
    if token is None:
        raise RuntimeError("a message with transferred buffers arrived where no mesh token is known")
    buffers = list(buffers)
    for i in indices:
        if not isinstance(buffers[i], _native.RecvBuffer):  # (not pulled on arrival, XFER-2)
            buffers[i] = _native.Descriptor(buffers[i]).fetch_new(token, STREAMS)
    return view[8 + 4 * count :], buffers


# -- reducers ----------------------------------------------------------------------


def is_tensor(obj: Any) -> bool:
    """A dense tensor whose bytes can travel out of band (sparse, quantized and
    nested tensors keep torch's own pickling, in the message)."""
    torch = sys.modules.get("torch")
    return (
        torch is not None
        and isinstance(obj, torch.Tensor)
        and type(obj) in (torch.Tensor, torch.nn.Parameter)
        and obj.layout == torch.strided
        and not obj.is_quantized
        and not obj.is_nested
    )


def reduce_tensor(t: Any) -> Any:
    """A tensor as (its bytes out of band, dtype, shape, strides): the receiver builds
    it on the received memory, strides included (a view sends the span it covers)."""
    import torch

    device = str(t.device)
    src = t.detach()
    if src.is_conj() or src.is_neg():  # lazy conjugate/negative views: their values
        src = src.resolve_conj().resolve_neg()
    token = current_token.get()
    if src.device.type == "cuda" and token is not None and src.numel():
        return _reduce_cuda(t, src, token)
    if src.device.type != "cpu":
        src = src.cpu()  # staged through host memory
    if src.numel() == 0:
        base, shape, stride = torch.empty(0, dtype=src.dtype), tuple(src.shape), tuple(src.stride())
    else:
        base, shape, stride = _span(src)
    raw: Any = base.view(torch.uint8).numpy() if base.numel() else bytearray()
    param = isinstance(t, torch.nn.Parameter)
    return rebuild_tensor, (
        pickle.PickleBuffer(raw),
        str(src.dtype).removeprefix("torch."),
        shape,
        stride,
        t.requires_grad,
        device,
        param,
    )


def rebuild_tensor(
    buf: Any,
    dtype: str,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    grad: bool,
    device: str,
    param: bool,
) -> Any:
    import torch

    dt = getattr(torch, dtype)
    n = memoryview(buf).nbytes
    u8 = torch.frombuffer(buf, dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
    t = u8.view(dt).as_strided(shape, stride) if n else torch.empty(shape, dtype=dt)
    if device.startswith("cuda") and torch.cuda.is_available():
        index = device.partition(":")[2]
        t = t.to(device if index and int(index) < torch.cuda.device_count() else "cuda")
    return _finish(t, grad, param)


def _finish(t: Any, grad: bool, param: bool) -> Any:
    """``t`` as the sender had it: a Parameter, or a tensor that requires grad."""
    import torch

    if param:
        return torch.nn.Parameter(t, requires_grad=grad)
    return t.requires_grad_(grad) if grad else t


def _span(src: Any) -> tuple[Any, tuple[int, ...], tuple[int, ...]]:
    """The flat span of memory ``src`` covers, with the shape and strides that view it."""
    import torch

    shape, stride = tuple(src.shape), tuple(src.stride())
    if src.is_contiguous():
        return src.reshape(-1), shape, tuple(torch.empty(shape, dtype=torch.uint8, device="meta").stride())
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    return torch.as_strided(src, (span,), (1,), src.storage_offset()), shape, stride


def _reduce_cuda(t: Any, src: Any, token: str) -> Any:
    """GPU-1: a CUDA tensor travels as a CUDA IPC handle, for receivers that see its
    GPU, and as a copy staged in pinned host memory and registered with the engine,
    for those that do not. Each receiver takes one path and releases the staged copy
    (read or not); the sender's GPU memory stays valid while a receiver maps it
    (torch's CUDA IPC reference counting)."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor as torch_reduce

    base, shape, stride = _span(src)
    staged = torch.empty(base.numel() * base.element_size(), dtype=torch.uint8, pin_memory=True)
    staged.copy_(base.view(torch.uint8))
    readers, registered = current_readers.get()
    raw: Any = staged.numpy()
    desc = _native.xfer_register(raw, token, readers, TTL)
    if registered is not None:
        registered.append(desc.id)
    ipc: Any = None
    gpu = ""
    if readers == 1:  # torch's IPC reference count is one per share: one receiver
        try:
            # A copy of the value now: the receiver maps it later, after the sender may
            # have changed the tensor. Torch keeps the block until the receiver's count
            # is released (it maps and frees it, or releases it unmapped).
            ipc = torch_reduce(base.clone())[1]
            gpu = str(torch.cuda.get_device_properties(src.device).uuid)
        except Exception:  # no IPC here (a driver or sharing strategy without it)
            ipc, gpu = None, ""
    dtype = str(src.dtype).removeprefix("torch.")
    return rebuild_cuda, (
        ipc,
        gpu,
        desc,
        dtype,
        shape,
        stride,
        t.requires_grad,
        isinstance(t, torch.nn.Parameter),
    )


def _release_ipc(ipc: Any) -> None:
    """Gives back the sender's IPC reference count of a handle this process did not
    map, so that the sender's CUDA memory is freed (torch frees it at zero)."""
    try:
        storage_cls, device, ref_handle, ref_offset = ipc[4], ipc[6], ipc[11], ipc[12]
        storage_cls._release_ipc_counter(ref_handle, ref_offset, device=device)
    except Exception:  # a torch without CUDA IPC: the sender keeps the block until it exits
        pass


def _visible_cuda_index(gpu: str) -> int | None:
    """This process's index of the GPU whose UUID is ``gpu``, or None if it cannot see it."""
    import torch

    if not gpu or not torch.cuda.is_available():
        return None
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == gpu:
            return i
    return None


def rebuild_cuda(
    ipc: Any,
    gpu: str,
    desc: _native.Descriptor,
    dtype: str,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    grad: bool,
    param: bool,
) -> Any:
    import torch

    token = token_of(desc)
    local = _visible_cuda_index(gpu)
    t = None
    if ipc is not None and local is not None:
        try:
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            args = list(ipc)
            args[6] = local  # the storage's device, in this process's numbering
            shared = rebuild_cuda_tensor(*args)
            ipc = None  # mapped: freeing `shared` releases the sender's count
            t = shared.view(getattr(torch, dtype)).as_strided(shape, stride).clone()  # a copy of our own
            del shared
        except Exception:
            t = None  # the staged copy below
    if ipc is not None:
        _release_ipc(ipc)
    if t is not None:
        desc.release(token)  # the staged copy was not needed
        return _finish(t, grad, param)
    # The staged copy: onto the same GPU where this process sees it, else onto its own
    # GPU (one per proc with per_host={"gpus": N}), else it stays on the CPU.
    buf = desc.fetch_new(token, STREAMS)
    target = f"cuda:{local}" if local is not None else "cuda"
    return rebuild_tensor(buf, dtype, shape, stride, grad, target, param)


def reduce_memoryview(m: memoryview) -> Any:
    c = m if m.c_contiguous else memoryview(m.tobytes())
    return _memoryview, (pickle.PickleBuffer(c.cast("B")), c.format, c.shape)


def _memoryview(buf: Any, fmt: str, shape: tuple[int, ...]) -> memoryview:
    m: Any = memoryview(buf).cast("B")
    return m.cast(fmt, shape) if shape else m


__all__ = [
    "HEADER",
    "STREAMS",
    "THRESHOLD",
    "calling_token",
    "current_token",
    "is_tensor",
    "receive_remote",
    "reduce_memoryview",
    "reduce_tensor",
    "send_remote",
]
