from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_RUNNING: _ClassVar[WorkerState]
    WORKER_STATE_EXITED: _ClassVar[WorkerState]
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_RUNNING: WorkerState
WORKER_STATE_EXITED: WorkerState

class PingWorkersRequest(_message.Message):
    __slots__ = ("epoch", "timeout_ms", "usage")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    timeout_ms: int
    usage: bool
    def __init__(self, epoch: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., usage: _Optional[bool] = ...) -> None: ...

class PingWorkersReply(_message.Message):
    __slots__ = ("pings",)
    PINGS_FIELD_NUMBER: _ClassVar[int]
    pings: _containers.RepeatedCompositeFieldContainer[WorkerPing]
    def __init__(self, pings: _Optional[_Iterable[_Union[WorkerPing, _Mapping]]] = ...) -> None: ...

class WorkerPing(_message.Message):
    __slots__ = ("rank", "answered", "pid", "epoch", "error", "measured", "cpu", "rss")
    RANK_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    RSS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    answered: bool
    pid: int
    epoch: int
    error: str
    measured: bool
    cpu: float
    rss: int
    def __init__(self, rank: _Optional[int] = ..., answered: _Optional[bool] = ..., pid: _Optional[int] = ..., epoch: _Optional[int] = ..., error: _Optional[str] = ..., measured: _Optional[bool] = ..., cpu: _Optional[float] = ..., rss: _Optional[int] = ...) -> None: ...

class SpawnWorkersRequest(_message.Message):
    __slots__ = ("count", "executable", "args", "env", "cwd", "epoch", "first_rank", "request_id")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COUNT_FIELD_NUMBER: _ClassVar[int]
    EXECUTABLE_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_RANK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    count: int
    executable: str
    args: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    cwd: str
    epoch: int
    first_rank: int
    request_id: str
    def __init__(self, count: _Optional[int] = ..., executable: _Optional[str] = ..., args: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., cwd: _Optional[str] = ..., epoch: _Optional[int] = ..., first_rank: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("rank", "pid", "addr", "state", "exit_code", "signal", "host", "proc_state", "restarts", "exit_cause")
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PROC_STATE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CAUSE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    pid: int
    addr: str
    state: WorkerState
    exit_code: int
    signal: int
    host: str
    proc_state: str
    restarts: int
    exit_cause: str
    def __init__(self, rank: _Optional[int] = ..., pid: _Optional[int] = ..., addr: _Optional[str] = ..., state: _Optional[_Union[WorkerState, str]] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., host: _Optional[str] = ..., proc_state: _Optional[str] = ..., restarts: _Optional[int] = ..., exit_cause: _Optional[str] = ...) -> None: ...

class SpawnWorkersReply(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersReply(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class LogsRequest(_message.Message):
    __slots__ = ("rank", "tail")
    RANK_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    rank: int
    tail: int
    def __init__(self, rank: _Optional[int] = ..., tail: _Optional[int] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("rank", "stream", "text", "origin", "time_us", "pid", "kind")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TEXT: _ClassVar[LogLine.Kind]
        END_MARK: _ClassVar[LogLine.Kind]
        PROMPT: _ClassVar[LogLine.Kind]
        INPUT: _ClassVar[LogLine.Kind]
        DISPLAY: _ClassVar[LogLine.Kind]
        ACTOR_FAILURE: _ClassVar[LogLine.Kind]
    TEXT: LogLine.Kind
    END_MARK: LogLine.Kind
    PROMPT: LogLine.Kind
    INPUT: LogLine.Kind
    DISPLAY: LogLine.Kind
    ACTOR_FAILURE: LogLine.Kind
    RANK_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    rank: int
    stream: str
    text: str
    origin: str
    time_us: int
    pid: int
    kind: LogLine.Kind
    def __init__(self, rank: _Optional[int] = ..., stream: _Optional[str] = ..., text: _Optional[str] = ..., origin: _Optional[str] = ..., time_us: _Optional[int] = ..., pid: _Optional[int] = ..., kind: _Optional[_Union[LogLine.Kind, str]] = ...) -> None: ...

class LogsReply(_message.Message):
    __slots__ = ("lines",)
    LINES_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedCompositeFieldContainer[LogLine]
    def __init__(self, lines: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentEvent(_message.Message):
    __slots__ = ("worker_exited", "log", "dropped", "stopping")
    WORKER_EXITED_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    worker_exited: WorkerInfo
    log: LogLine
    dropped: int
    stopping: Stopping
    def __init__(self, worker_exited: _Optional[_Union[WorkerInfo, _Mapping]] = ..., log: _Optional[_Union[LogLine, _Mapping]] = ..., dropped: _Optional[int] = ..., stopping: _Optional[_Union[Stopping, _Mapping]] = ...) -> None: ...

class Stopping(_message.Message):
    __slots__ = ("by",)
    BY_FIELD_NUMBER: _ClassVar[int]
    by: str
    def __init__(self, by: _Optional[str] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class ShutdownReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentPingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentPingReply(_message.Message):
    __slots__ = ("pid", "name", "epoch", "watchers", "idle_left_ms", "owner")
    PID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    WATCHERS_FIELD_NUMBER: _ClassVar[int]
    IDLE_LEFT_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    pid: int
    name: str
    epoch: int
    watchers: int
    idle_left_ms: int
    owner: str
    def __init__(self, pid: _Optional[int] = ..., name: _Optional[str] = ..., epoch: _Optional[int] = ..., watchers: _Optional[int] = ..., idle_left_ms: _Optional[int] = ..., owner: _Optional[str] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("at_least", "owner")
    AT_LEAST_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    at_least: int
    owner: str
    def __init__(self, at_least: _Optional[int] = ..., owner: _Optional[str] = ...) -> None: ...

class AttachReply(_message.Message):
    __slots__ = ("epoch", "name", "meta", "workers", "actors")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    name: str
    meta: str
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    actors: _containers.RepeatedCompositeFieldContainer[ActorRecord]
    def __init__(self, epoch: _Optional[int] = ..., name: _Optional[str] = ..., meta: _Optional[str] = ..., workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., actors: _Optional[_Iterable[_Union[ActorRecord, _Mapping]]] = ...) -> None: ...

class ActorRecord(_message.Message):
    __slots__ = ("name", "payload", "buffers", "shape", "epoch")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    payload: bytes
    buffers: _containers.RepeatedScalarFieldContainer[bytes]
    shape: bytes
    epoch: int
    def __init__(self, name: _Optional[str] = ..., payload: _Optional[bytes] = ..., buffers: _Optional[_Iterable[bytes]] = ..., shape: _Optional[bytes] = ..., epoch: _Optional[int] = ...) -> None: ...

class RecordActorReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ForgetActorRequest(_message.Message):
    __slots__ = ("name", "epoch")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    epoch: int
    def __init__(self, name: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class RespawnWorkersRequest(_message.Message):
    __slots__ = ("ranks", "epoch")
    RANKS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedScalarFieldContainer[int]
    epoch: int
    def __init__(self, ranks: _Optional[_Iterable[int]] = ..., epoch: _Optional[int] = ...) -> None: ...
