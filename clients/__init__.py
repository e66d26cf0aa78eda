"""gnnserve client SDK: classify graph nodes with a gnnserve server over gRPC.

Light on purpose: importing it loads only grpc, protobuf and NumPy (never torch or the server).

Example::

    from clients import GnnClient

    with GnnClient("127.0.0.1:8500") as client:
        res = client.predict("cora-sage", [0, 1, 2], sampling_width=16, ppr_budget=64)
        print(res.labels)                 # int64 [3]
        print(res.probabilities.shape)    # (3, num_classes), float32
        print(res.settings, res.timing)   # what ran, and how long each stage took

:class:`AsyncGnnClient` has the same methods as coroutines. Failures raise the typed exceptions of
:mod:`clients.errors` (``InvalidArgumentError``, ``NotFoundError``, ``UnavailableError``, ...).
The generated API types live in ``clients._gen``; the ``gnnserve predict`` / ``gnnserve models``
commands are in :mod:`clients.cli`.
"""

from .aio import AsyncGnnClient
from .client import GnnClient
from .errors import (
    AbortedError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    GnnServeError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from .types import (
    Backoff,
    ClientOptions,
    KnobRow,
    ModelInfo,
    NewNode,
    PredictResult,
    Settings,
    Timing,
    UpdateResult,
)

__version__ = "0.1.0"

__all__ = [
    "AbortedError",
    "AsyncGnnClient",
    "Backoff",
    "CancelledError",
    "ClientOptions",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "GnnClient",
    "GnnServeError",
    "InternalError",
    "InvalidArgumentError",
    "KnobRow",
    "ModelInfo",
    "NewNode",
    "NotFoundError",
    "PermissionDeniedError",
    "PredictResult",
    "ResourceExhaustedError",
    "Settings",
    "Timing",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UpdateResult",
    "__version__",
]
