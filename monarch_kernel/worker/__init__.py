"""The worker side: the dispatcher that runs actors for the native ``Worker`` server,
and the worker process's entry point (``python -m monarch_kernel.worker``)."""

from monarch_kernel.worker._dispatcher import Dispatcher

__all__ = ["Dispatcher"]
