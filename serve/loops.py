"""Which asyncio event loop the server runs on: uvloop where it is installed, the standard one otherwise.

``grpc.aio`` works on any asyncio loop. The server's event-loop thread spends most of its time in
gRPC's Cython code and in asyncio's own scheduling (``benchmarks/ceiling.py --profile``); uvloop
(libuv under asyncio's interface) makes the second part cheaper. Measured on the 2-vCPU VM,
64-node GCN requests, one server process (docs/BENCHMARKS.md, 2026-11-26 13:30 UTC): 1.07x-1.10x the node
predictions/s of asyncio's loop, 7.4-7.9 against 8.2-8.4 us of server CPU per node.

``kind``: ``"auto"`` (uvloop if it imports, else asyncio: a platform without uvloop wheels still
serves), ``"uvloop"`` (fail with a message when it is missing) or ``"asyncio"``.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["EVENT_LOOPS", "loop_name", "new_event_loop", "resolve_event_loop", "run"]

EVENT_LOOPS = ("auto", "uvloop", "asyncio")

T = TypeVar("T")


def resolve_event_loop(kind: str) -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop ``kind`` stands for on this machine. ``ValueError`` for an
    unknown kind, or ``"uvloop"`` asked for where it cannot be imported."""
    if kind not in EVENT_LOOPS:
        raise ValueError(f"unknown event loop {kind!r}: choose one of {', '.join(EVENT_LOOPS)}")
    if kind == "asyncio":
        return kind
    try:
        importlib.import_module("uvloop")
    except ImportError as exc:
        if kind == "uvloop":
            raise ValueError(f"event loop 'uvloop' asked for but it cannot be imported ({exc}); "
                             "install it (pip install uvloop) or use --event-loop asyncio") from exc
        return "asyncio"
    return "uvloop"


def new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new, unstarted loop of ``kind`` (:func:`resolve_event_loop`)."""
    if resolve_event_loop(kind) == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T], kind: str) -> T:
    """``asyncio.run(coro)`` on a loop of ``kind``: the loop is made, run to the coroutine's end (its
    remaining tasks cancelled, async generators closed) and closed."""
    if resolve_event_loop(kind) == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``"uvloop"`` or ``"asyncio"`` for a running or new loop (for logs and tests)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
