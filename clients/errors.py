"""Typed exceptions of the client SDK, one per gRPC status code, mapped in one place.

Every failed call raises a :class:`GnnServeError` subclass whose ``code`` is the gRPC status and
whose ``details`` is the server's message, unchanged (it names the offending value: an id out of
range, an unknown model, a knob out of range). Several classes also derive from the matching
Python built-in so generic handlers work: :class:`InvalidArgumentError` is a ``ValueError``,
:class:`NotFoundError` a ``LookupError``, :class:`UnavailableError` a ``ConnectionError`` and
:class:`DeadlineExceededError` a ``TimeoutError``.

Example::

    from clients import GnnClient
    from clients.errors import InvalidArgumentError, NotFoundError

    with GnnClient("127.0.0.1:8500") as client:
        try:
            client.predict("cora-sage", [10**9])
        except InvalidArgumentError as exc:
            print(exc.code.name, exc.details)  # INVALID_ARGUMENT node ids out of range [0, 2708): 1000000000
        except NotFoundError as exc:
            print("no such model:", exc.details)
"""

from __future__ import annotations

from typing import Any

import grpc

__all__ = [
    "AbortedError",
    "CancelledError",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "GnnServeError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "error_for_code",
    "from_rpc_error",
]


class GnnServeError(Exception):
    """A call failed. ``code``: the :class:`grpc.StatusCode`; ``details``: the server's message.

    ``method`` names the RPC (``"Predict"``, ...) when known and ``attempts`` says how many times
    the call was sent (more than 1 after retries on ``UNAVAILABLE``). ``str(exc)`` reads
    ``"CODE: details"`` (plus the number of attempts when there were several).

    Example::

        try:
            client.get_model("nope")
        except GnnServeError as exc:
            print(exc.code.name, exc.details)
    """

    default_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        details: str,
        *,
        code: grpc.StatusCode | None = None,
        method: str | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(details)
        self.details = details
        self.code: grpc.StatusCode = code if code is not None else self.default_code
        self.method = method
        self.attempts = attempts

    def __str__(self) -> str:
        tail = f" (after {self.attempts} attempts)" if self.attempts > 1 else ""
        return f"{self.code.name}: {self.details}{tail}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.name}, details={self.details!r}, attempts={self.attempts})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.details, self.code.name, self.method, self.attempts))


def _rebuild(cls: type[GnnServeError], details: str, code: str, method: str | None, attempts: int) -> GnnServeError:
    return cls(details, code=grpc.StatusCode[code], method=method, attempts=attempts)


class InvalidArgumentError(GnnServeError, ValueError):
    """``INVALID_ARGUMENT``: ids out of range, an empty or oversized list, a knob out of range,
    a malformed new node. The message names the offending value. Never retried."""

    default_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(GnnServeError, LookupError):
    """``NOT_FOUND``: unknown model or version (the message lists what the server has)."""

    default_code = grpc.StatusCode.NOT_FOUND


class ResourceExhaustedError(GnnServeError):
    """``RESOURCE_EXHAUSTED``: the model's queue is full, or a message exceeds a size limit.

    Retried only when the client was built with ``retry_resource_exhausted=True``."""

    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(GnnServeError, ConnectionError):
    """``UNAVAILABLE``: no connection, the server is starting or shutting down, the model is not
    ready, or a dependency (the feature store) is down. Retried with backoff by the client."""

    default_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceededError(GnnServeError, TimeoutError):
    """``DEADLINE_EXCEEDED``: the call's deadline (``timeout``) passed before the answer came."""

    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class UnauthenticatedError(GnnServeError):
    """``UNAUTHENTICATED``: missing or wrong bearer token."""

    default_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(GnnServeError):
    """``PERMISSION_DENIED``: authenticated but not allowed."""

    default_code = grpc.StatusCode.PERMISSION_DENIED


class DataLossError(GnnServeError):
    """``DATA_LOSS``: stored data on the server failed its checks (it was not used)."""

    default_code = grpc.StatusCode.DATA_LOSS


class InternalError(GnnServeError):
    """``INTERNAL``: a server bug (the message carries an incident id found in the server log),
    or a reply the client could not make sense of."""

    default_code = grpc.StatusCode.INTERNAL


class UnimplementedError(GnnServeError):
    """``UNIMPLEMENTED``: the address answers gRPC but is not a gnnserve server (or an older one)."""

    default_code = grpc.StatusCode.UNIMPLEMENTED


class AbortedError(GnnServeError):
    """``ABORTED``: an update's ``expect_graph_version`` no longer held (another update came first); or a chunked
    ``predict`` whose chunks the graph's updates kept answering at different versions (``max_version_rounds``,
    ``allow_mixed_versions``). Both mean: concurrent updates; calling again may succeed."""

    default_code = grpc.StatusCode.ABORTED


class CancelledError(GnnServeError):
    """``CANCELLED`` from the server side (this SDK never cancels a call itself): a server that stopped
    while the call waited in its gRPC queues, or grpc-core shedding calls under a flood far past the
    server's capacity (docs/RELIABILITY.md, "Limits"). Retried like ``UNAVAILABLE`` (``max_retries``);
    raised once the retries are spent. Not :class:`asyncio.CancelledError`: an asyncio task's own
    cancellation is never turned into this."""

    default_code = grpc.StatusCode.CANCELLED


class FailedPreconditionError(GnnServeError):
    """``FAILED_PRECONDITION``: the server cannot do this in its present state (a read-only server
    asked for a graph update; answers that would not be finite because stored values overflow)."""

    default_code = grpc.StatusCode.FAILED_PRECONDITION


# The one place status codes meet exception classes; codes not listed map to GnnServeError itself.
_BY_CODE: dict[grpc.StatusCode, type[GnnServeError]] = {
    cls.default_code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        ResourceExhaustedError,
        UnavailableError,
        DeadlineExceededError,
        UnauthenticatedError,
        PermissionDeniedError,
        DataLossError,
        InternalError,
        UnimplementedError,
        AbortedError,
        FailedPreconditionError,
        CancelledError,
    )
}


def error_for_code(
    code: grpc.StatusCode, details: str, *, method: str | None = None, attempts: int = 1
) -> GnnServeError:
    """The typed exception for ``code`` carrying ``details``.

    Example::

        >>> error_for_code(grpc.StatusCode.NOT_FOUND, "model 'x' not found")
        NotFoundError(code=NOT_FOUND, details="model 'x' not found", attempts=1)
    """
    cls = _BY_CODE.get(code, GnnServeError)
    return cls(details, code=code, method=method, attempts=attempts)


def from_rpc_error(err: grpc.RpcError, *, method: str | None = None, attempts: int = 1) -> GnnServeError:
    """Translate a ``grpc.RpcError`` (sync) or ``grpc.aio.AioRpcError`` into a typed exception.

    Example::

        try:
            stub.Predict(request)
        except grpc.RpcError as err:
            raise from_rpc_error(err, method="Predict") from err
    """
    code_fn = getattr(err, "code", None)
    details_fn = getattr(err, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    text = details or f"{method or 'call'} failed ({code.name})"
    return error_for_code(code, text, method=method, attempts=attempts)
