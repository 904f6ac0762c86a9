"""The checked-in grpcio stubs are what ``make stubs`` generates from proto/: this
test fails when the .proto file and the stubs drift apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTO = "proto/monarch_kernel/v1/agent.proto"
STUBS = ["agent_pb2.py", "agent_pb2_grpc.py", "agent_pb2.pyi"]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("grpc_tools")
    out = tmp_path_factory.mktemp("stubs")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iproto",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--pyi_out={out}",
            PROTO,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return out / "monarch_kernel" / "v1"


@pytest.mark.parametrize("name", STUBS)
def test_checked_in_stub_matches_the_proto(regenerated: Path, name: str):
    checked_in = (ROOT / "monarch_kernel" / "v1" / name).read_bytes()
    fresh = (regenerated / name).read_bytes()
    assert checked_in == fresh, f"monarch_kernel/v1/{name} is out of date with {PROTO}: run `make stubs`"
