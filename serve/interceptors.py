"""Server interceptors: the one place exceptions become gRPC statuses, and bearer-token auth.

:class:`ErrorMappingInterceptor` wraps every unary handler: a domain exception
(:mod:`serve.errors`, feature-store errors) is answered with its status code and message; any
other exception is logged with its traceback and a request id, and answered ``INTERNAL`` with
only that id, never internals. A request whose bytes do not parse is answered ``INVALID_ARGUMENT``
(not gRPC's own UNKNOWN with the parser's exception text), and messages are bounded to
:data:`MAX_DETAILS_CHARS` (they can echo request fields). ``Predict``, ``ModelInfer`` and ``UpdateGraph``
requests are first checked on their bytes for what they declare (:mod:`serve.wire`): a request of more ids
(or update entries) than the limit is refused before protobuf allocates them; a server started with
``--read-only`` refuses every ``UpdateGraph`` without parsing it. It also counts finished RPCs by code (a
call the client cancelled or whose deadline passed as ``CANCELLED`` / ``DEADLINE_EXCEEDED``, never
``OK``; the ``model`` label only ever names a served model, so client-chosen names cannot grow the
series), and admits RPCs through the server's :class:`DrainGate`.

:class:`DrainGate` is the first step of a graceful stop. Once it closes, every new RPC but health
checks and Triton's ``ServerLive`` is answered ``UNAVAILABLE`` by the server's own handler, and
the server waits for the admitted ones before it stops gRPC. Leaving the refusal to gRPC's
``server.stop(grace)`` alone is racy: a call that reaches the server while grpc-core shuts down is
cancelled, and the client sees ``CANCELLED``, a code clients do not retry.

:class:`BearerAuthInterceptor` checks ``authorization: Bearer <token>`` metadata with a
constant-time comparison; a missing or wrong token gets ``UNAUTHENTICATED`` and nothing else (the request body of such a call
is never parsed).
Health checks stay open so orchestrators can probe without the token.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from .errors import (
    READ_ONLY_REFUSAL,
    GnnServeError,
    InvalidArgument,
    ReadOnly,
    Unavailable,
    detached,
    status_for,
)
from .metrics import ServerMetrics
from .wire import WireLimits, check_infer, check_predict, check_update

__all__ = ["MAX_DETAILS_CHARS", "BearerAuthInterceptor", "DrainGate", "ErrorMappingInterceptor", "bounded"]

log = logging.getLogger(__name__)

# what an orchestrator's probe calls: unary, answered at once. Health/Watch and reflection are streams a client
# holds open, and every open stream counts against --max-concurrent-rpcs: open to anyone, a thousand of them
# locked the token holders out (RESOURCE_EXHAUSTED; QA 2026-11-27), so they need the token like the rest
_OPEN_METHODS = ("/grpc.health.v1.Health/Check",)


MAX_DETAILS_CHARS = 1024

PREDICT_METHOD = "/gnnserve.v1.GnnService/Predict"
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
UPDATE_METHOD = "/gnnserve.v1.GnnService/UpdateGraph"

_UNGATED_METHODS = ("/grpc.health.v1.Health/", "/inference.GRPCInferenceService/ServerLive")


class DrainGate:
    """Admission of RPCs and the count of admitted ones, for a graceful stop.

    ``enter`` admits an RPC or, once :meth:`close` was called, raises :class:`Unavailable`;
    ``leave`` ends an admitted one; :meth:`wait_idle` returns when none is left running.
    Event-loop only (no locks): the interceptor calls it from the server's loop.
    """

    def __init__(self, gauge: Any | None = None) -> None:
        self.open = True
        self.inflight = 0
        self._gauge = gauge  # a prometheus Gauge mirroring ``inflight``
        self._idle: asyncio.Event | None = None

    @staticmethod
    def gates(full_method: str) -> bool:
        """Whether ``full_method`` is refused while draining (all but health and liveness probes)."""
        return not full_method.startswith(_UNGATED_METHODS)

    def enter(self, method: str) -> None:
        if not self.open:
            raise Unavailable(f"{method}: the server is shutting down and takes no new requests; "
                              "retry on another replica")
        self.inflight += 1
        if self._gauge is not None:
            self._gauge.inc()

    def leave(self) -> None:
        self.inflight -= 1
        if self._gauge is not None:
            self._gauge.dec()
        if self.inflight == 0 and self._idle is not None:
            self._idle.set()

    def close(self) -> None:
        """Refuse new RPCs from now on; admitted ones run on."""
        self.open = False

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the admitted RPCs to finish; whether they all did."""
        if self.inflight == 0:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:  # builtin TimeoutError only from Python 3.11
            return False
        return True


def bounded(message: str, limit: int = MAX_DETAILS_CHARS) -> str:
    """``message`` cut to at most ``limit`` characters, keeping its start and its end.

    Messages echo parts of the request (a model name, ids); a client can send megabytes of them, and
    the status message travels in an HTTP/2 trailer that clients refuse beyond a few KiB (the
    caller would see a transport error instead of the real status) and lands in the log.
    """
    if len(message) <= limit:
        return message
    cut = len(message) - limit + 40
    head = (limit - 40) * 2 // 3
    return f"{message[:head]} ...[{cut} characters elided]... {message[head + cut:]}"


def _model_of(request: Any) -> str:
    for attr in ("model", "model_name", "name"):
        v = getattr(request, attr, None)
        if isinstance(v, str) and v:
            return v
    return ""


def _request_id_of(request: Any) -> str:
    """The client's id of a request (``PredictRequest.request_id``, ``ModelInferRequest.id``), or ""."""
    for attr in ("request_id", "id"):
        v = getattr(request, attr, None)
        if isinstance(v, str) and v:
            return v[:64]
    return ""


def error_status(exc: Exception, method: str, request_id: str = "") -> tuple[grpc.StatusCode, str]:
    """The status a failed call (or a failed request of a stream) is answered with, logged once: a
    known exception's code and message (the caller bounds it as it sends it); anything else INTERNAL
    with an incident id only, its traceback in the log under that id."""
    mapped = status_for(exc, request_id)
    if mapped is not None:
        code, message = mapped
        log.info("%s -> %s: %s", method, code.name, bounded(message))
        return code, message
    incident = uuid.uuid4().hex[:12]
    log.exception("%s failed unexpectedly (incident %s)", method, incident)
    return grpc.StatusCode.INTERNAL, f"internal error (incident {incident}); the server log has the details"


def unparsed_reason(request: Any) -> str | None:
    """Why a request that reached a handler is not a message: refused from its bytes or undecodable
    (for stream handlers, which get these stand-ins per message, see :class:`ErrorMappingInterceptor`);
    ``None`` for a parsed message."""
    if isinstance(request, _Refused):
        return request.message
    if isinstance(request, _Undecodable):
        return f"the request ({request.size} bytes) is not a valid message of its type and cannot be parsed"
    return None


class _Undecodable:
    """Stands in for a request whose bytes do not parse (answered INVALID_ARGUMENT by the handler)."""

    def __init__(self, size: int) -> None:
        self.size = size


class _Refused:
    """Stands in for a request refused from its bytes, before parsing (:mod:`serve.wire`): ``error`` is the
    refusal (without its traceback, whose frames hold the request's bytes)."""

    def __init__(self, error: GnnServeError) -> None:
        self.error = error
        self.message = error.message


def _lenient(deserializer: Callable[[bytes], Any] | None,
             precheck: Callable[[bytes], None] | None = None) -> Callable[[bytes], Any] | None:
    """A deserializer that returns :class:`_Undecodable` instead of raising, and :class:`_Refused`
    when ``precheck`` (a declared-size check of the raw bytes) refuses the request.

    gRPC answers a deserializer's exception with UNKNOWN and the exception's class and text
    (``Unexpected <class 'google.protobuf.message.DecodeError'>: ...``): a malformed request would
    get the wrong code and internals in its message.
    """
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        if precheck is not None:
            try:
                precheck(data)
            except GnnServeError as exc:
                return _Refused(detached(exc))
        try:
            return deserializer(data)
        except Exception:
            return _Undecodable(len(data))

    return parse


def _ignore_body(data: bytes) -> None:
    return None


def _refuse_updates(data: bytes) -> None:
    """The precheck of ``UpdateGraph`` on a ``--read-only`` server: refused whatever it holds, unparsed."""
    raise ReadOnly(READ_ONLY_REFUSAL)


def _wrap_unary(
    handler: grpc.RpcMethodHandler,
    fn: Callable[[Any, aio.ServicerContext, Callable[..., Awaitable[Any]]], Awaitable[Any]],
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler:
    # a partial, not a coroutine of its own: an error's traceback would hold that frame, and with it the request
    # (ErrorMappingInterceptor drops its own reference before it aborts the call)
    call = functools.partial(fn, inner=handler.unary_unary)

    return grpc.unary_unary_rpc_method_handler(
        call, request_deserializer=request_deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class ErrorMappingInterceptor(aio.ServerInterceptor):
    """Maps exceptions to status codes (see module docstring) and counts RPCs by code."""

    def __init__(self, metrics: ServerMetrics | None = None, gate: DrainGate | None = None, *,
                 wire_limits: WireLimits | None = None,
                 model_label: Callable[[str], str] | None = None, read_only: bool = False) -> None:
        self._metrics = metrics
        self._gate = gate
        # the declared-size checks of request bytes, by full method name (serve.wire); a --read-only server
        # (``read_only``) takes no update at all: refused unparsed, FAILED_PRECONDITION as the graph would
        limits = wire_limits or WireLimits()
        self._prechecks: dict[str, Callable[[bytes], None]] = {
            PREDICT_METHOD: lambda data: check_predict(data, limits),
            INFER_METHOD: lambda data: check_infer(data, limits),
            STREAM_INFER_METHOD: lambda data: check_infer(data, limits),  # per message of the stream
            UPDATE_METHOD: _refuse_updates if read_only else lambda data: check_update(data, limits),
        }
        # a request's model name as a metric label: only names the server knows ("" otherwise), so a
        # client cannot make a new time series per name it sends
        self._model_label = model_label or (lambda name: "")
        # method -> (the handler it wrapped, the wrapper): built once per method, not per RPC
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        full_method = handler_call_details.method
        known = self._wrapped.get(full_method)
        if known is not None and known[0] is handler:
            return known[1]
        if handler.stream_stream is not None and full_method == STREAM_INFER_METHOD:
            # each message of the stream gets the declared-size check and the lenient parse; the
            # handler answers a stand-in (unparsed_reason) with an error message on the stream
            wrapped = grpc.stream_stream_rpc_method_handler(
                handler.stream_stream,
                request_deserializer=_lenient(handler.request_deserializer, self._prechecks[full_method]),
                response_serializer=handler.response_serializer)
            self._wrapped[full_method] = (handler, wrapped)
            return wrapped
        if handler.unary_unary is None:
            return handler
        method = full_method.rsplit("/", 1)[-1]
        metrics = self._metrics
        gate = self._gate
        model_label = self._model_label

        async def guarded(request: Any, context: aio.ServicerContext, inner: Callable[..., Awaitable[Any]]) -> Any:
            code = grpc.StatusCode.OK
            admitted = counted = False

            def count() -> None:
                nonlocal counted
                if metrics is not None and not counted:
                    metrics.count_request(model_label(_model_of(request)), method, code.name)
                    counted = True

            try:
                if isinstance(request, _Undecodable):
                    raise InvalidArgument(f"the {method} request ({request.size} bytes) is not a valid message "
                                          "of its type and cannot be parsed")
                if isinstance(request, _Refused):
                    raise type(request.error)(request.message)  # a new one: the stand-in would hold its traceback
                if gate is not None and gate.gates(full_method):
                    gate.enter(method)
                    admitted = True
                return await inner(request, context)
            except aio.AbortError:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except asyncio.CancelledError:  # the client cancelled, or its deadline passed while we worked
                remaining = context.time_remaining()
                code = (grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining <= 0
                        else grpc.StatusCode.CANCELLED)
                raise
            except Exception as exc:
                code, message = error_status(exc, method, _request_id_of(request))  # logs the traceback if needed
                count()  # before the reply leaves: a client that has seen it finds it counted
                # the abort's AbortError stays in the call's state, which this frame's ``context`` references, and
                # its traceback holds this frame (a cycle, freed only by the cyclic GC), with ``exc`` as its
                # context: neither may keep the request (or the frames of the handler, which hold it) alive
                detached(exc)
                request = None
                await context.abort(code, bounded(message))
            finally:
                if admitted:
                    gate.leave()  # type: ignore[union-attr]
                count()

        wrapped = _wrap_unary(handler, guarded,
                              _lenient(handler.request_deserializer, self._prechecks.get(full_method)))
        self._wrapped[full_method] = (handler, wrapped)
        return wrapped


#: ``Bearer`` and the whitespace after it in an ``authorization`` value: the scheme in any case, then one or
#: more spaces or tabs (RFC 7235 section 2.1, RFC 6750 section 2.1)
_BEARER_SCHEME = re.compile(rb"bearer[ \t]+", re.IGNORECASE)


def bearer_token(value: str | bytes) -> bytes | None:
    """The token of an ``authorization`` metadata value ``Bearer <token>`` (None when the value is not of
    that form: another scheme, a bare token, no token). The scheme is case-insensitive and may be followed
    by several spaces or tabs; the token is everything after them, as sent."""
    raw = value.encode() if isinstance(value, str) else bytes(value)
    m = _BEARER_SCHEME.match(raw)
    if m is None or m.end() == len(raw):
        return None
    return raw[m.end():]


#: the least time between two WARNING lines about refused (unauthenticated) calls; each line counts the calls
#: refused since the one before
AUTH_LOG_INTERVAL_S = 60.0


class BearerAuthInterceptor(aio.ServerInterceptor):
    """Requires ``authorization: Bearer <token>`` on every RPC but the health check ``Health/Check`` (the
    scheme in any case, one or more spaces or tabs before the token: :func:`bearer_token`). The streams a
    client holds open (``Health/Watch``, reflection) need it too: each counts against the server's limit of
    RPCs at once, which anonymous streams could otherwise fill.

    A refused call is counted in ``gnnserve_requests_total`` (``metrics``) with code UNAUTHENTICATED, model ""
    (a client cannot make series by the names it sends) and its method, and logged rate-limited: one WARNING
    line at most every ``log_interval_s`` seconds, with the number of calls refused since the last line and the
    peer address and method of the latest one; never the token sent."""

    def __init__(self, token: str, metrics: ServerMetrics | None = None, *,
                 log_interval_s: float = AUTH_LOG_INTERVAL_S) -> None:
        if not token or not token.strip():
            raise ValueError("bearer token must be non-empty and not blank")
        # compared as SHA-256 digests with hmac.compare_digest: constant time in the content and,
        # unlike comparing the raw values, in the length of the expected token as well
        self._expected = hashlib.sha256(token.encode()).digest()
        self._metrics = metrics
        self._log_interval_s = float(log_interval_s)
        self._refused_lock = threading.Lock()
        self._refused = 0  # refused since the last WARNING line
        self._next_line = 0.0  # time.monotonic() from which the next line may be written

    def _refuse(self, method: str, context: aio.ServicerContext) -> None:
        """Count and (rate-limited) log a call refused for its token (before the refusal leaves)."""

        def peer() -> str:
            try:
                return str(context.peer())
            except Exception:  # the peer is a courtesy: the count is what matters
                return "an unknown peer"

        self.refused(method, peer)

    def refused(self, method: str, peer: str | Callable[[], str]) -> None:
        """Count and (rate-limited) log one request refused for its token: a gRPC call (:meth:`_refuse`) or an HTTP
        request (serve.http, whose ``method`` labels start with ``http_``). ``peer``: its address, or a function
        that gives it (only called when a line is written)."""
        if self._metrics is not None:
            self._metrics.count_request("", method, grpc.StatusCode.UNAUTHENTICATED.name)
        now = time.monotonic()
        with self._refused_lock:
            self._refused += 1
            if now < self._next_line:
                return
            n, self._refused, self._next_line = self._refused, 0, now + self._log_interval_s
        if callable(peer):
            peer = peer()
        log.warning("refused %d call(s) without a valid bearer token (missing, wrong or not 'Bearer <token>') since "
                    "the last such line; the latest: %s from %s (at most one such line per %.0f s; "
                    "gnnserve_requests_total{code=\"UNAUTHENTICATED\"} counts every one)", n, method, peer,
                    self._log_interval_s)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method.startswith(_OPEN_METHODS):
            return await continuation(handler_call_details)
        given: bytes | None = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key.lower() == "authorization":
                given = bearer_token(value)
                break
        # no token (or not a bearer one) is hashed and compared too, as a wrong one is; the expected token is
        # never empty, so b"" never matches
        if hmac.compare_digest(hashlib.sha256(given or b"").digest(), self._expected) and given:
            return await continuation(handler_call_details)
        del given  # never logged nor kept
        handler = await continuation(handler_call_details)
        short = method.rsplit("/", 1)[-1]  # the method label of gnnserve_requests_total (a served method only)

        async def deny(request: Any, context: aio.ServicerContext, inner: Callable[..., Awaitable[Any]]) -> Any:
            self._refuse(short, context)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

        if handler is None:  # no such method: UNIMPLEMENTED, not counted (its name is the client's)
            return handler
        if handler.unary_unary is not None:  # the body of an unauthenticated call is never parsed
            return _wrap_unary(handler, deny, _ignore_body)

        async def deny_stream(request_or_iterator: Any, context: aio.ServicerContext) -> Any:
            self._refuse(short, context)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

        ser = {"request_deserializer": _ignore_body, "response_serializer": handler.response_serializer}
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(deny_stream, **ser)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(deny_stream, **ser)
        return grpc.stream_stream_rpc_method_handler(deny_stream, **ser)
