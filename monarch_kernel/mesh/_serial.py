"""Serialization of messages: cloudpickle, protocol 5, out-of-band buffers.

Classes and functions defined in ``__main__`` (a notebook) travel by value. Buffers
(ndarrays, tensors' storage, large bytes and bytearrays wherever they are) travel out
of band, beside the pickle. Only authenticated peers ever reach :func:`loads` (AUTH-1
in the native core).
"""

from __future__ import annotations

import io
import linecache
import pickle
import traceback
import types
from typing import Any

import cloudpickle

from monarch_kernel import _native
from monarch_kernel.errors import MessageTooLargeError, SerializationError
from monarch_kernel.mesh import _buffers
from monarch_kernel.mesh._role import here

MAX_MESSAGE_BYTES: int = _native.MAX_MESSAGE_BYTES


def _code(filename: str, source: list[str], args: tuple[Any, ...]) -> types.CodeType:
    """Rebuilds a code object sent by value, with its file name, and registers the
    source lines so remote tracebacks show them."""
    if source and filename not in linecache.cache:
        linecache.cache[filename] = (sum(map(len, source)), None, source, filename)
    return types.CodeType(*args)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, except that code sent by value keeps its file name (cloudpickle
    writes ``<dynamic-code>``) and carries its source lines, for remote tracebacks."""

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)  # (never bytes or bytearray: see _BytesBeside)
        if t is memoryview:
            return _buffers.reduce_memoryview(obj)
        if _buffers.is_tensor(obj):
            return _buffers.reduce_tensor(obj)
        if isinstance(obj, types.CodeType):
            fn, args = cloudpickle.cloudpickle._code_reduce(obj)
            filename = obj.co_filename
            args = tuple(filename if a == "<dynamic-code>" else a for a in args)
            return _code, (filename, linecache.getlines(filename), args)
        return super().reducer_override(obj)


class _BytesBeside(_Pickler):
    """``_Pickler`` that also sends large ``bytes`` and ``bytearray`` out of band,
    wherever they are (in a user's object, a set, however deep): the C pickler writes
    those types inline without asking ``reducer_override``, but it asks
    ``persistent_id`` of every object. That costs a Python call per object pickled,
    so a message takes this pickler only when the plain one met such a bytes
    (``_Sink``)."""

    def __init__(self, file: Any, protocol: int, buffer_callback: Any) -> None:
        super().__init__(file, protocol=protocol, buffer_callback=buffer_callback)
        #: The persistent id of each large bytes met, by id: met twice, sent once.
        self._ids: dict[int, tuple[str, pickle.PickleBuffer]] = {}

    def persistent_id(self, obj: Any) -> Any:
        t = type(obj)
        if (t is not bytes and t is not bytearray) or len(obj) < _buffers.THRESHOLD:
            return None
        pid = self._ids.get(id(obj))
        if pid is None:
            # (the same tuple each time: the pickler memoizes it, so the buffer goes once)
            pid = self._ids[id(obj)] = (t.__name__, pickle.PickleBuffer(obj))
        return pid


class _Unpickler(pickle.Unpickler):
    """Rebuilds what ``_BytesBeside`` sent out of band; a bytes met twice is one
    object again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rebuilt: dict[int, bytes | bytearray] = {}

    def persistent_load(self, pid: Any) -> Any:
        kind, buf = pid
        out = self._rebuilt.get(id(pid))
        if out is None:
            # (a copy: a bytes owns its memory, it cannot stand on what the engine filled)
            out = self._rebuilt[id(pid)] = bytearray(buf) if kind == "bytearray" else bytes(buf)
        return out


class _InlineBytes(Exception):
    """The plain pickler met a large bytes or bytearray: pickle with ``_BytesBeside``."""


class _Sink:
    """What the plain pickler writes a message to. The C pickler hands a payload of
    64 KiB or more to ``write`` as it is, the bytes or bytearray object itself, right
    after writing its opcode; this stops the pickling there (``_InlineBytes``), before
    anything copies it."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[Any] = []

    def write(self, b: Any) -> int:
        t = type(b)
        if (t is bytes or t is bytearray) and len(b) >= _buffers.THRESHOLD and self.parts:
            if _bytes_opcode(self.parts[-1], len(b)):
                raise _InlineBytes
        self.parts.append(b)
        return len(b)

    def value(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


def _bytes_opcode(head: bytes, n: int) -> bool:
    """Whether ``head`` ends with the opcode of a bytes or bytearray of ``n`` bytes
    (BINBYTES, BINBYTES8, BYTEARRAY8), not of a str's text (BINUNICODE...)."""
    if len(head) >= 5 and head[-5] == 0x42 and int.from_bytes(head[-4:], "little") == n:
        return True
    return len(head) >= 9 and head[-9] in (0x8E, 0x96) and int.from_bytes(head[-8:], "little") == n


def _pickle_message(obj: Any, buffers: list[Any], by_reducers: list[int]) -> bytes:
    """``obj`` pickled, its buffers out of band (appended to ``buffers``)."""
    sink = _Sink()
    try:
        _Pickler(sink, protocol=5, buffer_callback=buffers.append).dump(obj)
        return sink.value()
    except _InlineBytes:  # again, with them out of band (what reducers registered, anew)
        _buffers.drop_now(by_reducers)
        by_reducers.clear()
        buffers.clear()
    with io.BytesIO() as f:
        _BytesBeside(f, protocol=5, buffer_callback=buffers.append).dump(obj)
        return f.getvalue()


def _cloudpickle_dumps(obj: Any) -> bytes:
    """``obj`` pickled whole, buffers in band."""
    with io.BytesIO() as f:
        _Pickler(f, protocol=5).dump(obj)
        return f.getvalue()


# Values of these types pickle the same with the C pickler as with cloudpickle, which
# costs several times more per call: small messages of plain data take the fast path.
_PLAIN = frozenset({int, float, str, bool, type(None), bytes, complex})
_FAST_MAX_ITEMS = 16


def _is_plain(obj: Any, depth: int = 0) -> bool:
    t = type(obj)
    if t in _PLAIN:
        return t is not bytes or len(obj) < 65536  # big bytes go out of band
    if depth > 2 or (t is not tuple and t is not list and t is not dict) or len(obj) > _FAST_MAX_ITEMS:
        return False
    if t is dict:
        return all(type(k) is str and _is_plain(v, depth + 1) for k, v in obj.items())
    return all(_is_plain(x, depth + 1) for x in obj)


def dumps(
    obj: Any,
    what: str,
    token: str | None = None,
    readers: int = 1,
    registered: list[int] | None = None,
    live: list[int] | None = None,
) -> tuple[bytes, list[Any]]:
    """Pickles ``obj``; ``what`` names it in errors ("arguments of counter.incr").

    With the mesh ``token``, buffers of at least ``_buffers.THRESHOLD`` bytes go
    through the transfer engine, registered for ``readers`` receivers (their ids are
    appended to ``registered``); there is no size limit on those but memory. Those
    that are the sender's own memory, not a copy (all but staged CUDA tensors), are
    also appended to ``live``: the sender waits for them to be read (XFER-2).
    """
    if _is_plain(obj):
        data = pickle.dumps(obj, protocol=5)
        _check_size(len(data), what)
        return data, []
    buffers: list[pickle.PickleBuffer] = []
    reset = _buffers.current_token.set(token)
    by_reducers: list[int] = []  # what reducers registered while pickling (CUDA tensors)
    reset_readers = _buffers.current_readers.set((readers, by_reducers))
    try:
        data = _pickle_message(obj, buffers, by_reducers)
    except Exception as e:  # pickling runs arbitrary __reduce__ code
        _buffers.drop_now(by_reducers)
        raise SerializationError(
            f"cannot pickle the {what}: {type(e).__name__}: {e}. Pass picklable values "
            "(plain data, tensors, arrays, classes or functions defined in a module or cell)."
        ) from e
    except BaseException:  # an interrupt while pickling: what it registered ends too
        _buffers.drop_now(by_reducers)
        raise
    finally:
        _buffers.current_token.reset(reset)
        _buffers.current_readers.reset(reset_readers)
    raws: list[Any] = []
    for b in buffers:
        try:
            raws.append(b.raw())
        except BufferError:  # not contiguous: send a contiguous copy
            raws.append(memoryview(b).tobytes())
    remote: list[int] = []
    ids: list[int] = []
    if token is not None:
        header, raws, remote, ids = _buffers.send_remote(raws, token, readers)
        data = header + data if header else data
    inline = sum(memoryview(r).nbytes for i, r in enumerate(raws) if i not in remote)
    try:
        _check_size(len(data) + inline, what)
    except MessageTooLargeError:
        _buffers.drop_now(by_reducers + ids)
        raise
    if registered is not None:
        registered.extend(by_reducers + ids)
    if live is not None:
        live.extend(ids)
    return data, raws


def _check_size(size: int, what: str) -> None:
    if size > MAX_MESSAGE_BYTES:
        raise MessageTooLargeError(
            f"the {what} pickle to {size:,} bytes, above the control plane's limit of "
            f"{MAX_MESSAGE_BYTES:,} bytes. Send large tensors in pieces, or keep them on the "
            "workers and send only what you need back."
        )


def dumps_exception(exc: BaseException | None, formatted: str) -> tuple[bytes, list[Any]]:
    """A remote exception for its caller: its formatted traceback, and the exception
    pickled on its own, so that the text arrives even where the exception cannot be
    rebuilt (a class whose ``__init__`` takes other arguments than it gives
    ``BaseException``, or one the caller cannot import)."""
    return dumps((formatted, _pickled_exception(exc)), "exception")


def _pickled_exception(exc: BaseException | None) -> bytes | None:
    if exc is None:
        return None
    try:
        return _cloudpickle_dumps(exc)
    except Exception:  # the exception itself does not pickle: its text goes alone
        return None


def exception_blob(exc: BaseException) -> tuple[str, bytes | None]:
    """``exc`` as (its formatted traceback, itself pickled or None): what
    :func:`rebuild_exception` turns back into an exception in another process."""
    if not isinstance(exc, BaseException):
        raise TypeError(f"exception() needs an exception, not {type(exc).__name__}")
    formatted = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return formatted, _pickled_exception(exc)


def rebuild_exception(formatted: str, inner: bytes | None) -> BaseException:
    """Undoes :func:`exception_blob`: the exception itself, or where it cannot be
    rebuilt here an ``ActorError`` carrying its text."""
    exc, formatted = _unpickle_exception(formatted, inner)
    if exc is not None:
        return exc
    from monarch_kernel.errors import ActorError

    return ActorError(None, "an exception that cannot be rebuilt here was sent", formatted)


def loads_exception(data: Any, buffers: list[Any], token: str | None) -> tuple[BaseException | None, str]:
    """Undoes :func:`dumps_exception`: (the exception, or None where it cannot be
    rebuilt here, and the formatted traceback)."""
    formatted, inner = loads(data, buffers, token)
    return _unpickle_exception(formatted, inner)


def _unpickle_exception(formatted: str, inner: bytes | None) -> tuple[BaseException | None, str]:
    if inner is None:
        return None, formatted
    try:
        return pickle.loads(inner), formatted
    except Exception as e:
        return None, f"{formatted}(the exception could not be rebuilt here: {type(e).__name__}: {e})\n"


def loads(data: Any, buffers: list[Any] | None = None, token: str | None = None) -> Any:
    """Unpickles a message; buffers that came through the transfer engine are pulled
    first, with ``token`` (default: this worker's own mesh token)."""
    if not buffers and type(data) is bytes and not data.startswith(_buffers.HEADER):
        return pickle.loads(data)  # (a call's hot path: nothing out of band)
    data, bufs = _buffers.receive_remote(data, buffers or [], token or here.token)
    if not bufs:  # (nothing went out of band: no persistent ids either)
        return pickle.loads(data)
    with io.BytesIO(data) as f:
        return _Unpickler(f, buffers=bufs).load()
