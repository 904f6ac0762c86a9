"""The curated public API: ``monarch_kernel.__all__`` is pinned, and every name in it
imports; the exception tree keeps Monarch's exception types."""

from __future__ import annotations

import importlib
import re

import pytest

import monarch_kernel
from monarch_kernel import errors

PUBLIC = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "ChannelTransport",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "MeshFailure",
    "MeshInfo",
    "MeshNotFoundError",
    "MeshOwnershipError",
    "MeshStoppedError",
    "MeshTensorError",
    "MonarchKernelError",
    "Point",
    "Port",
    "PortReceiver",
    "ProcId",
    "ProcMesh",
    "RDMABuffer",
    "RemoteException",
    "Shape",
    "Stream",
    "SupervisionError",
    "Tensor",
    "TransferBuffer",
    "Uid",
    "ValueMesh",
    "as_endpoint",
    "attach",
    "attach_to_workers",
    "coalescing",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "debug_controller",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "fetch_shard",
    "gather",
    "get_active_mesh",
    "get_active_stream",
    "get_meter",
    "get_or_spawn_controller",
    "gpu_direct_rdma_supported",
    "grad_generator",
    "hosts_from_config",
    "inspect",
    "list_meshes",
    "local_proc_mesh",
    "no_mesh",
    "proc_mesh",
    "reduce",
    "reduce_",
    "remote",
    "returns_future",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "scatter",
    "send",
    "show",
    "shutdown_context",
    "sim_proc_mesh",
    "slice_mesh",
    "span",
    "start_worker_loop_forever",
    "this_host",
    "this_proc",
    "to_mesh",
    "traced",
    "unhandled_fault_hook",
]


def test_the_public_names_are_exactly_the_pinned_list():
    assert monarch_kernel.__all__ == PUBLIC


def test_the_pinned_list_is_sorted_and_has_no_duplicates():
    assert PUBLIC == sorted(set(PUBLIC))


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_importable(name):
    module = importlib.import_module("monarch_kernel")
    assert getattr(module, name) is not None
    namespace: dict[str, object] = {}
    exec(f"from monarch_kernel import {name}", namespace)
    assert namespace[name] is getattr(module, name)


def test_star_import_gives_the_public_names():
    namespace: dict[str, object] = {}
    exec("from monarch_kernel import *", namespace)
    assert set(PUBLIC) <= set(namespace)


def test_every_error_in_errors_all_is_importable_and_derives_from_the_root():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.MonarchKernelError), name


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        ("SupervisionError", RuntimeError),
        ("MeshStoppedError", RuntimeError),
        ("MessageTooLargeError", ValueError),
        ("SerializationError", TypeError),
        ("MeshSpecError", ValueError),
        ("UnknownEndpointError", AttributeError),
        ("DimensionError", TypeError),
        ("MeshIndexError", IndexError),
    ],
)
def test_errors_are_also_the_builtin_exception_monarch_raises(error, builtin):
    assert issubclass(getattr(errors, error), builtin)


def _drawn_tree() -> dict[str, str]:
    """Each class of the tree drawn in ``errors``' docstring, with its parent there."""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in errors.__doc__.splitlines():
        m = re.match(r"^(\s*)(?:[│ ]\s*)*(?:├── |└── )?([A-Z]\w+)(?:\s|$)", line)
        branch = re.search(r"[├└]── ", line)
        if line.strip() == "MonarchKernelError":
            stack = [(-1, "MonarchKernelError")]
            continue
        if not stack or not branch or m is None:
            continue
        depth = branch.start()
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[m.group(2)] = stack[-1][1]
        stack.append((depth, m.group(2)))
    return parents


def test_the_tree_drawn_in_errors_docstring_is_the_class_tree():
    drawn = _drawn_tree()
    assert set(drawn) == set(errors.__all__) - {"MonarchKernelError"}, "drawn vs __all__"
    for name, parent in drawn.items():
        bases = [
            b.__name__ for b in getattr(errors, name).__bases__ if issubclass(b, errors.MonarchKernelError)
        ]
        assert bases == [parent], f"{name}: drawn under {parent}, derives from {bases}"


def test_a_stopped_mesh_error_is_a_supervision_error():
    assert issubclass(errors.MeshStoppedError, errors.SupervisionError)


def test_public_error_names_are_the_ones_in_errors():
    assert monarch_kernel.ActorError is errors.ActorError
    assert monarch_kernel.SupervisionError is errors.SupervisionError
    assert monarch_kernel.MeshStoppedError is errors.MeshStoppedError
    assert monarch_kernel.MonarchKernelError is errors.MonarchKernelError
