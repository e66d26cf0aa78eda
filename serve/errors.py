"""Domain exceptions of the server, each carrying the gRPC status code it maps to.

One place decides the mapping (KServe's habit): code below the servicer raises these; the
interceptor in :mod:`serve.interceptors` turns them into statuses. Anything else that escapes is
logged with its traceback and answered ``INTERNAL`` without internals in the reply.
"""

from __future__ import annotations

import grpc

__all__ = [
    "DataCorrupt",
    "DeadlineExceeded",
    "GnnServeError",
    "InvalidArgument",
    "ModelNotFound",
    "Overloaded",
    "Unauthenticated",
    "Unavailable",
    "status_for",
]


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


class DeadlineExceeded(GnnServeError):
    """The request's deadline passed before its batch ran; its work was dropped."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataCorrupt(GnnServeError):
    """Stored data failed its checks (a feature blob of the wrong length, NaN): never used."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(GnnServeError):
    """Missing or wrong bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The (code, message) a known exception maps to, or ``None`` for an unexpected one.

    Feature-store errors are mapped here too, so the store layer stays free of gRPC.
    """
    if isinstance(exc, GnnServeError):
        return exc.code, exc.message
    try:
        from .features.base import FeatureCorrupt, FeatureNotFound, FeatureUnavailable
    except ImportError:  # pragma: no cover - the store package is part of serve
        return None
    if isinstance(exc, FeatureUnavailable):
        return grpc.StatusCode.UNAVAILABLE, f"feature store unavailable: {exc}"
    if isinstance(exc, FeatureCorrupt):
        return grpc.StatusCode.DATA_LOSS, f"feature data failed its checks: {exc}"
    if isinstance(exc, FeatureNotFound):
        return grpc.StatusCode.UNAVAILABLE, f"features missing from the store: {exc}"
    return None
