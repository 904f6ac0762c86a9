"""Monarch's ``monarch.rdma``: ``RDMABuffer`` is this project's ``TransferBuffer``,
moved by the native TCP transfer engine on any host (there is no RDMA hardware path:
docs/monarch-compat.md)."""

from __future__ import annotations

from monarch_kernel.mesh import TransferBuffer

RDMABuffer = TransferBuffer


class RDMAReadTransferWarning(Warning):
    """Monarch warns with it about a slow RDMA read; never raised here."""


class RDMAWriteTransferWarning(Warning):
    """Monarch warns with it about a slow RDMA write; never raised here."""


class RDMATcpFallbackWarning(Warning):
    """Monarch warns with it when RDMA falls back to TCP; here TCP is the one path."""


def is_rdma_available() -> bool:
    """Whether ``RDMABuffer`` works here: always (over the TCP transfer engine)."""
    return True


def is_ibverbs_available() -> bool:
    """Whether transfers use ibverbs: never here (the native TCP engine moves them)."""
    return False


def get_rdma_backend() -> str:
    """The transport that moves ``RDMABuffer``s: ``"tcp"``."""
    return "tcp"


class RDMAAction:
    """Monarch's batch of RDMA operations. Not here: raises on use."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            "monarch_kernel has no RDMAAction: call read_into / write_from on each RDMABuffer "
            "(each is a Future; gather them to wait for all)"
        )


__all__ = [
    "RDMAAction",
    "RDMABuffer",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]
