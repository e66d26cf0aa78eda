"""Domain exceptions of the server, each carrying the gRPC status code it maps to.

One place decides the mapping (KServe's habit): code below the servicer raises these; the
interceptor in :mod:`serve.interceptors` turns them into statuses. Anything else that escapes is
logged with its traceback and answered ``INTERNAL`` without internals in the reply.
"""

from __future__ import annotations

import logging
import uuid
from typing import TypeVar

import grpc

__all__ = [
    "DataCorrupt",
    "DeadlineExceeded",
    "GnnServeError",
    "GraphOutOfService",
    "InvalidArgument",
    "ModelNotFound",
    "Overloaded",
    "ReadOnly",
    "Unauthenticated",
    "Unavailable",
    "detached",
    "status_for",
]

log = logging.getLogger(__name__)

E = TypeVar("E", bound=BaseException)


class GnnServeError(Exception):
    """Base class: ``code`` is the gRPC status, ``str(exc)`` the message a user can act on."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(GnnServeError):
    """The request is malformed: ids out of range, empty/oversized lists, bad knob values."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ModelNotFound(GnnServeError):
    """No such model, or no such version of it."""

    code = grpc.StatusCode.NOT_FOUND


class Overloaded(GnnServeError):
    """The model's queue is full: retry later (with backoff) or send less."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(GnnServeError):
    """A dependency is down (feature store), the model is not ready, or the server is shutting down."""

    code = grpc.StatusCode.UNAVAILABLE


class ModelRefused(GnnServeError):
    """A model version on disk whose load failed for a reason retrying cannot mend (a damaged or mis-configured
    checkpoint, a dataset not found): out of service until its files change. Not UNAVAILABLE, which clients
    retry."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class GraphOutOfService(GnnServeError):
    """The model's graph was taken out of service (serve.live ``LiveGraph.broken``: its update log lost records or
    was replaced, an update failed half-way, storing refreshed PPR lists failed): it stays so until the server is
    restarted (which replays the update log), so FAILED_PRECONDITION, which clients do not retry against this
    server, not UNAVAILABLE (kept for causes that may pass). The server's health says NOT_SERVING meanwhile, so
    that an orchestrator restarts it and a balancer sends the traffic elsewhere."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ReadOnly(GnnServeError):
    """Updates are turned off on this server (``--read-only``), or another server writes the graph's log."""

    code = grpc.StatusCode.FAILED_PRECONDITION


#: the refusal of every UpdateGraph by a server started with ``--read-only`` (serve.live, and the interceptor,
#: which answers it without parsing the request)
READ_ONLY_REFUSAL = "this server does not take graph updates: it was started with --read-only"


class DeadlineExceeded(GnnServeError):
    """The request's deadline passed before its batch ran; its work was dropped."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataCorrupt(GnnServeError):
    """Stored data failed its checks (a feature blob of the wrong length, NaN): never used."""

    code = grpc.StatusCode.DATA_LOSS


class NonFiniteOutput(GnnServeError):
    """The model's answer for some nodes is not finite: values around them (features or edge weights loaded
    with the graph) overflow float32. Never answered as a result."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(GnnServeError):
    """Missing or wrong bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED


def detached(exc: E) -> E:
    """``exc`` without its traceback and its chained exceptions (``__context__``, ``__cause__``), for an error kept
    or answered after the frames that raised it have returned. A traceback keeps every frame it passed, with their
    locals: the request being served, and often what holds the error itself (a ticket, a future, the gRPC call
    state that keeps an abort): a reference cycle, so the request stayed in memory until Python's cyclic garbage
    collector ran (a hostile-client report: ~940 MB per refused 60 MB update)."""
    exc.__traceback__ = None
    exc.__context__ = None
    exc.__cause__ = None
    return exc


def _reference(exc: BaseException, request_id: str = "") -> str:
    """The id a client can quote to the operator: the request id (given, or carried by the
    exception), else a fresh incident id; the server log line with the details names it."""
    rid = request_id or getattr(exc, "request_id", "") or ""
    return f"request {rid}" if rid else f"incident {uuid.uuid4().hex[:12]}"


#: (error class name, gRPC status, what failed, what to do) for the store errors, most specific first
_STORE_ERRORS: tuple[tuple[str, grpc.StatusCode, str, str], ...] = (
    ("DataVersionChanged", grpc.StatusCode.DATA_LOSS,
     "the data version this model was serving was deleted or replaced in the store (Redis)",
     "the server refuses to mix data versions: the operator must reload the model or restart the server"),
    ("GraphCorrupt", grpc.StatusCode.DATA_LOSS, "graph data failed its checks in the store and was not used",
     "the operator should run `gnnserve graph verify` and reload the graph"),
    ("GraphUnavailable", grpc.StatusCode.UNAVAILABLE, "the graph store (Redis) is unavailable or not ready",
     "retry with backoff"),
    ("GraphNotFound", grpc.StatusCode.UNAVAILABLE, "graph data this request needs is missing from the store (Redis)",
     "retry later; the operator should (re)load the graph with `gnnserve graph load`"),
    ("FeatureCorrupt", grpc.StatusCode.DATA_LOSS, "feature data failed its checks in the store and was not used",
     "the operator should run `gnnserve features verify` and reload the features"),
    ("FeatureUnavailable", grpc.StatusCode.UNAVAILABLE, "the feature store (Redis) is unavailable or not ready",
     "retry with backoff"),
    ("FeatureNotFound", grpc.StatusCode.UNAVAILABLE, "features this request needs are missing from the store (Redis)",
     "retry later; the operator should (re)load them with `gnnserve features load`"),
)


def status_for(exc: BaseException, request_id: str = "") -> tuple[grpc.StatusCode, str] | None:
    """The (code, message) a known exception maps to, or ``None`` for an unexpected one.

    Feature- and graph-store errors are mapped here too, so the store layer stays free of gRPC.
    Their messages name infrastructure (the masked Redis URL: host, port, user) and the driver's
    exception text: those go to the server log only (one WARNING line with a reference), and the
    client gets what failed, what to do, and the reference (the request id when the exception
    carries one, else an incident id) to quote to the operator. ``request_id``: the id of the
    request being answered, when the caller knows it (the interceptor has the request).
    """
    if isinstance(exc, GnnServeError):
        return exc.code, exc.message
    try:
        from .features.base import FeatureStoreError
    except ImportError:  # pragma: no cover - the store package is part of serve
        return None
    if not isinstance(exc, FeatureStoreError):
        return None
    names = {c.__name__ for c in type(exc).__mro__}
    for cls_name, code, what, todo in _STORE_ERRORS:
        if cls_name in names:
            ref = _reference(exc, request_id)
            log.warning("%s (%s) -> %s: %s", type(exc).__name__, ref, code.name, exc)
            return code, f"{what}; {todo} ({ref}: the server log has the details)"
    return None
