"""docs/monarch-compat.md stays true: it lists every public name of Monarch's
``monarch.actor`` and ``monarch.job`` and the tensor engine's names of ``monarch``, each name it lists exists here, and every
public name of ``monarch_kernel`` and ``monarch_kernel.job`` is in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import monarch_kernel
import monarch_kernel.job

DOC = Path(__file__).resolve().parents[2] / "docs" / "monarch-compat.md"

#: ``monarch.actor.__all__`` of torchmonarch 0.7 and Monarch's main branch (union),
#: with ``concurrent_endpoint`` (``monarch._src.actor.concurrent``, exported on main).
MONARCH_ACTOR = [
    "Accumulator", "Actor", "ActorError", "as_endpoint", "attach_to_workers", "Channel",
    "ChannelTransport", "concurrent_endpoint", "config", "context", "Context",
    "current_actor_name", "current_rank", "current_size", "debug_controller",
    "enable_transport", "endpoint", "Endpoint", "Extent", "Future", "get_or_spawn_controller",
    "gpu_direct_rdma_supported", "HostMesh", "hosts_from_config", "local_proc_mesh",
    "MeshFailure", "Point", "Port", "PortReceiver", "proc_mesh", "ProcMesh",
    "run_worker_loop_forever", "send", "shutdown_context", "sim_proc_mesh", "this_host",
    "this_proc", "unhandled_fault_hook", "ValueMesh",
]  # fmt: skip
#: Monarch's tensor engine (``import monarch``), the names this package keeps.
MONARCH_TENSOR = [
    "coalescing", "fetch_shard", "get_active_mesh", "get_active_stream", "grad_generator",
    "inspect", "no_mesh", "reduce", "reduce_", "remote", "RemoteException", "show",
    "slice_mesh", "Stream", "Tensor", "to_mesh",
]  # fmt: skip
#: ``monarch.job.__all__``.
MONARCH_JOB = ["JobTrait", "job_load", "job_loads", "JobState", "LocalJob", "ProcessJob", "SlurmJob"]


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _table_names(section: str) -> dict[str, str]:
    """``name -> status`` of a section's table rows (``| `name` | status | ...``)."""
    rows = re.findall(r"^\| `([A-Za-z_]+)` \| ([a-z ]+?) \|", section, re.MULTILINE)
    return dict(rows)


def _mentioned(section: str) -> set[str]:
    return set(re.findall(r"`([A-Za-z_][A-Za-z_0-9]*)`", section))


def test_every_name_of_monarch_actor_is_listed_with_a_status():
    listed = _table_names(_section("`monarch.actor`"))
    assert sorted(set(MONARCH_ACTOR) - set(listed)) == []
    assert set(listed.values()) <= {"same", "different", "not here"}


def test_every_name_of_monarch_job_is_listed_with_a_status():
    listed = _table_names(_section("`monarch.job`"))
    assert sorted(set(MONARCH_JOB) - set(listed)) == []
    assert set(listed.values()) <= {"same", "different", "not here"}


def test_every_tensor_engine_name_of_monarch_is_listed_with_a_status():
    listed = _table_names(_section("`monarch` (distributed tensors)"))
    assert sorted(set(MONARCH_TENSOR) - set(listed)) == []
    assert set(listed.values()) <= {"same", "different", "not here"}
    for name in listed:
        assert hasattr(monarch_kernel, name), f"docs/monarch-compat.md lists {name}; monarch_kernel lacks it"


@pytest.mark.parametrize("name", sorted(_table_names(_section("`monarch.actor`"))))
def test_each_listed_actor_name_exists_here(name):
    assert hasattr(monarch_kernel, name), (
        f"docs/monarch-compat.md lists {name} but monarch_kernel has no such name"
    )


@pytest.mark.parametrize("name", sorted(_table_names(_section("`monarch.job`"))))
def test_each_listed_job_name_exists_here(name):
    assert hasattr(monarch_kernel.job, name)


def test_every_public_name_of_monarch_kernel_is_in_the_page():
    mentioned = _mentioned(DOC.read_text())
    assert sorted(set(monarch_kernel.__all__) - mentioned) == []
    assert sorted(set(monarch_kernel.job.__all__) - mentioned) == []


def test_names_not_here_raise_not_implemented_only_when_used():
    listed = _table_names(_section("`monarch.actor`")) | _table_names(_section("`monarch.job`"))
    for name, status in listed.items():
        if status != "not here":
            continue
        thing = getattr(monarch_kernel, name, None) or getattr(monarch_kernel.job, name)
        with pytest.raises(NotImplementedError, match=r"\w"):
            thing()
