"""Neutral errors: redis-py exceptions become the store's own error classes, without secrets.

Each kind of data kept in Redis has its :class:`ErrorFamily` (unavailable, not found, corrupt):
:data:`FEATURE_ERRORS` (:mod:`serve.features.base`) and :data:`GRAPH_ERRORS` (the graph classes
below, subclasses of the feature ones so that a caller catching store errors catches both, and
mapped to gRPC statuses by name in :mod:`serve.errors`). Every function of the Redis layer that can
fail takes the family of the data it touches and raises its classes directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis.exceptions as rex

from ..features.base import FeatureCorrupt, FeatureNotFound, FeatureStoreError, FeatureUnavailable

if TYPE_CHECKING:
    from .connection import RedisTarget

__all__ = [
    "FEATURE_ERRORS",
    "GRAPH_ERRORS",
    "ErrorFamily",
    "GraphCorrupt",
    "GraphNotFound",
    "GraphUnavailable",
    "redis_errors",
]


class GraphUnavailable(FeatureUnavailable):
    """Redis holding the graph cannot be reached or is not ready (gRPC UNAVAILABLE)."""


class GraphNotFound(FeatureNotFound):
    """No live graph version, no PPR lists for a configuration, or keys missing (UNAVAILABLE)."""


class GraphCorrupt(FeatureCorrupt):
    """A graph blob failed its checks (DATA_LOSS); it is never used."""


@dataclass(frozen=True)
class ErrorFamily:
    """The error classes raised for one kind of data."""

    unavailable: type[FeatureUnavailable]
    not_found: type[FeatureNotFound]
    corrupt: type[FeatureCorrupt]


FEATURE_ERRORS = ErrorFamily(FeatureUnavailable, FeatureNotFound, FeatureCorrupt)
GRAPH_ERRORS = ErrorFamily(GraphUnavailable, GraphNotFound, GraphCorrupt)


@contextmanager
def redis_errors(target: RedisTarget, what: str, errors: ErrorFamily = FEATURE_ERRORS) -> Iterator[None]:
    """Translate redis-py exceptions raised inside the block into ``errors``' classes.

    Connection problems, timeouts, a server still loading its data, cluster failover and
    authentication failures become ``errors.unavailable``; ``WRONGTYPE`` (a key holding another
    Redis type) becomes ``errors.corrupt``. Store errors raised inside pass unchanged. Messages name
    the masked URL and never the password. The original exception is not chained (its text could
    hold connection details).
    """
    unavailable = errors.unavailable
    try:
        yield
    except FeatureStoreError:
        raise
    except (rex.AuthenticationError, rex.AuthorizationError, rex.NoPermissionError) as exc:
        raise unavailable(target.scrub(f"{what}: Redis at {target.masked} refused the credentials "
                                       f"({type(exc).__name__}: {exc})")) from None
    except rex.ResponseError as exc:
        msg = str(exc)
        if msg.startswith(("NOAUTH", "WRONGPASS")):
            raise unavailable(target.scrub(f"{what}: Redis at {target.masked} needs valid credentials "
                                           f"({msg})")) from None
        if msg.startswith("WRONGTYPE"):
            raise errors.corrupt(target.scrub(f"{what}: a key at {target.masked} holds the wrong Redis type "
                                              f"({msg})")) from None
        if isinstance(exc, (rex.ClusterDownError, rex.TryAgainError, rex.ReadOnlyError, rex.BusyLoadingError)) \
                or msg.startswith(("LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY")):
            raise unavailable(target.scrub(f"{what}: Redis at {target.masked} is not ready "
                                           f"({type(exc).__name__}: {msg})")) from None
        raise unavailable(target.scrub(f"{what}: Redis at {target.masked} answered an error "
                                       f"({type(exc).__name__}: {msg})")) from None
    except (rex.RedisError, rex.RedisClusterException, OSError) as exc:  # socket.timeout is an OSError
        raise unavailable(target.scrub(f"{what}: Redis at {target.masked} unavailable "
                                       f"({type(exc).__name__}: {exc})")) from None
