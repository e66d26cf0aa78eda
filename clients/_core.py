"""Logic shared by the blocking and the asyncio client, free of I/O.

* :class:`ChannelConfig`: target, credentials, channel options and call metadata from the
  constructor arguments (TLS material from paths or PEM bytes, bearer token).
* :func:`node_array`, :func:`new_node_messages`, :func:`knob_fields`: argument checking and
  conversion to protobuf.
* :class:`PredictPlan`: chunking of a long call into requests under the server's per-request node
  limit and under the message size limits, and reassembly of the replies in order.
* :class:`RetryState`: which failures are retried, how long to wait, and the call's deadline.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import random
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np

from ._gen import gnnserve_pb2 as pb
from .errors import (
    AbortedError,
    DeadlineExceededError,
    GnnServeError,
    InternalError,
    InvalidArgumentError,
    error_for_code,
)
from .types import Backoff, KnobRow, ModelInfo, NewNode, PredictResult, Settings, Timing, UpdateResult

log = logging.getLogger("clients")

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # what the client accepts / sends (the server uses the same)
# Requests are kept under gRPC's default receive limit (4 MiB) with headroom, so they fit any server.
REQUEST_BUDGET_BYTES = 3 * 1024 * 1024
RESPONSE_BUDGET_FRACTION = 0.75  # of the client's receive limit
LABEL_BYTES = 10  # worst-case varint of one int64 label
NODE_ID_BYTES = 10  # worst-case varint of one int64 node id
FIRST_EMBEDDING_CHUNK = 64  # nodes in the first chunk while the embedding width is still unknown
SAFE_UNCHUNKED = 1  # calls with at most this many rows skip the model lookup used for chunking
USER_AGENT = "gnnserve-python-client/0.1"


# --------------------------------------------------------------------------- channel
def _pem(value: bytes | str | os.PathLike[str] | None, what: str) -> bytes | None:
    """PEM bytes from bytes, a PEM string, or a path to a PEM file."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode()
    path = Path(value)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from exc


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host in ("localhost", "localhost.localdomain") or host.startswith("unix:"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_of(target: str) -> str:
    if target.startswith("unix:"):
        return target
    if target.startswith("["):
        return target[1 : target.find("]")]
    return target.rsplit(":", 1)[0] if target.count(":") == 1 else target


DEFAULT_PORT = 8500  # gnnserve serve --port


_PASSED_THROUGH = ("unix:", "unix-abstract:", "vsock:", "dns:", "ipv4:", "ipv6:")  # gRPC target syntax
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # http://, https://: not gRPC addresses


def server_address(value: str, option: str = "--server") -> str:
    """``--server`` as the SDK takes it: ``HOST:PORT``, with port :data:`DEFAULT_PORT` when only a
    host is given (gRPC itself would pick 443 for a bare name). ``[v6]`` and a bare IPv6 address get
    the port too; ``grpc://`` / ``grpcs://`` prefixes are kept, and other gRPC target forms
    (``unix:PATH``, ``dns:...``) pass unchanged. A port that is not a number from 1 to 65535, or a URL
    scheme such as ``http://``, is a usage error (``ValueError``).

    Example::

        >>> server_address("localhost"), server_address("[::1]"), server_address("grpcs://h:9")
        ('localhost:8500', '[::1]:8500', 'grpcs://h:9')
    """
    text = value.strip()
    scheme = next((p for p in ("grpc://", "grpcs://") if text.startswith(p)), "")
    rest = text[len(scheme):]
    if not rest:
        raise ValueError(f"{option} is empty: give HOST or HOST:PORT")
    if rest.startswith(_PASSED_THROUGH):
        return text
    url_scheme = _URL_SCHEME.match(rest)
    if url_scheme:  # http://host:port, say: the first ':' would otherwise read as a port or an IPv6 address
        raise ValueError(f"{option} {value!r}: gRPC addresses are HOST:PORT without a scheme (e.g. localhost:8500): "
                         f"drop {url_scheme.group(0)!r} (the only prefixes taken are grpc:// and grpcs://, TLS)")
    if rest.startswith("["):  # [v6] or [v6]:port
        close = rest.find("]")
        if close < 0:
            raise ValueError(f"{option} {value!r}: no ']' after the IPv6 address")
        host, after = rest[: close + 1], rest[close + 1 :]
        if after and not after.startswith(":"):
            raise ValueError(f"{option} {value!r}: expected ':PORT' after {host}")
        port = after[1:] if after else None
    elif rest.count(":") > 1:  # a bare IPv6 address (with a port it must be in brackets)
        try:
            ipaddress.IPv6Address(rest)
        except ValueError:
            raise ValueError(f"{option} {value!r}: an IPv6 address with a port is written [ADDRESS]:PORT") from None
        host, port = f"[{rest}]", None
    else:
        host, sep, port_text = rest.partition(":")
        port = port_text if sep else None
    if host in ("", "[]"):
        raise ValueError(f"{option} {value!r}: no host (HOST or HOST:PORT)")
    if port is None:
        return f"{scheme}{host}:{DEFAULT_PORT}"
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{option} {value!r}: the port must be a number from 1 to 65535, got {port!r}")
    return f"{scheme}{host}:{int(port)}"


@dataclass
class ChannelConfig:
    """Everything needed to open a channel and authorise calls (see :class:`clients.GnnClient`)."""

    target: str
    credentials: grpc.ChannelCredentials | None
    options: list[tuple[str, Any]]
    metadata: tuple[tuple[str, str], ...]
    max_receive_bytes: int

    @classmethod
    def build(
        cls,
        address: str,
        *,
        tls: bool,
        root_certificates: bytes | str | os.PathLike[str] | None,
        client_cert: bytes | str | os.PathLike[str] | None,
        client_key: bytes | str | os.PathLike[str] | None,
        tls_server_name: str | None,
        token: str | None,
        backoff: Backoff,
        channel_options: Sequence[tuple[str, Any]] | dict[str, Any] | None,
    ) -> ChannelConfig:
        if not isinstance(address, str) or not address.strip():
            raise ValueError(f"address must be 'host:port', got {address!r}")
        target = server_address(address, "address")  # a bare host: gnnserve's port, not gRPC's 443
        for scheme, secure in (("grpcs://", True), ("grpc://", False)):
            if target.startswith(scheme):
                target = target[len(scheme) :]
                tls = tls or secure
        root = _pem(root_certificates, "root certificates")
        cert = _pem(client_cert, "client certificate")
        key = _pem(client_key, "client key")
        if (cert is None) != (key is None):
            raise ValueError("client_cert and client_key go together: give both or neither")
        tls = tls or root is not None or cert is not None
        creds = None
        if tls:
            creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=cert)
        opts: dict[str, Any] = {
            "grpc.max_receive_message_length": DEFAULT_MAX_MESSAGE_BYTES,
            "grpc.max_send_message_length": DEFAULT_MAX_MESSAGE_BYTES,
            "grpc.primary_user_agent": USER_AGENT,
            # reconnect about as fast as the retry backoff so a server that comes up is found
            "grpc.initial_reconnect_backoff_ms": max(20, int(1000 * backoff.initial_s)),
            "grpc.min_reconnect_backoff_ms": max(20, int(1000 * backoff.initial_s)),
            "grpc.max_reconnect_backoff_ms": max(100, int(1000 * backoff.max_s)),
        }
        if tls_server_name:
            if not tls:
                raise ValueError("tls_server_name needs TLS")
            opts["grpc.ssl_target_name_override"] = tls_server_name
        user = dict(channel_options.items() if isinstance(channel_options, dict) else (channel_options or ()))
        opts.update(user)
        metadata: tuple[tuple[str, str], ...] = ()
        if token is not None:
            token = token.strip()
            if not token:
                raise ValueError("token is empty")
            if any(c in token for c in "\r\n"):
                raise ValueError("token must be a single line")
            metadata = (("authorization", f"Bearer {token}"),)
            if not tls and not _is_loopback(_host_of(target)):
                log.warning("sending a bearer token without TLS to %s: anyone on the path can read it", target)
        max_recv = int(opts["grpc.max_receive_message_length"])
        if max_recv < 0:  # -1 = unlimited in gRPC
            max_recv = 1 << 31
        return cls(target=target, credentials=creds, options=list(opts.items()), metadata=metadata,
                   max_receive_bytes=max_recv)


# --------------------------------------------------------------------------- arguments
def node_array(nodes: int | Iterable[int] | np.ndarray) -> np.ndarray:
    """int64 ``[n]`` from an id, a sequence, a range or an integer array. Values are checked by
    the server (it names ids out of range); here only the type is checked."""
    if isinstance(nodes, (bool, np.bool_)):
        raise InvalidArgumentError("nodes must be integer node ids, got a bool")
    if isinstance(nodes, Integral):
        v = int(nodes)
        if not -(2**63) <= v < 2**63:
            raise InvalidArgumentError(f"node id {v} does not fit int64")
        return np.array([v], dtype=np.int64)
    if isinstance(nodes, range):
        return np.arange(nodes.start, nodes.stop, nodes.step, dtype=np.int64)
    if isinstance(nodes, (str, bytes)):
        raise InvalidArgumentError(f"nodes must be integer node ids, got a string {nodes!r}")
    # an array-like (a torch tensor, a pandas Series) converts as a whole: iterating it makes an object per element
    array_like = isinstance(nodes, (np.ndarray, Sequence)) or hasattr(nodes, "__array__")
    arr = np.asarray(nodes if array_like else list(cast(Iterable[int], nodes)))
    if arr.ndim == 0 and arr.dtype.kind in "iu":  # a 0-d integer array (or tensor) is one id, as an int is
        return node_array(int(arr))
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise InvalidArgumentError(f"nodes must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind in "iu":
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise InvalidArgumentError(f"node id {int(arr.max())} does not fit int64")
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "O" and all(isinstance(v, Integral) and not isinstance(v, bool) for v in arr):
        try:
            return arr.astype(np.int64)
        except OverflowError as exc:
            raise InvalidArgumentError(f"node ids must fit int64: {exc}") from None
    raise InvalidArgumentError(f"nodes must be integer node ids, got dtype {arr.dtype}")


def _opt_int(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if not -(2**31) <= v < 2**31:
        raise InvalidArgumentError(f"{name} must fit int32, got {v}")
    return v


def knob_fields(
    sampling_width: int | None, ppr_budget: int | None, max_accuracy_loss: float | None,
    min_graph_version: int | None = None,
) -> dict[str, Any]:
    """The optional knob fields of a PredictRequest (and its read-your-writes version); ranges are
    checked by the server."""
    out: dict[str, Any] = _min_version(min_graph_version)
    s = _opt_int("sampling_width", sampling_width)
    k = _opt_int("ppr_budget", ppr_budget)
    if s is not None:
        out["sampling_width"] = s
    if k is not None:
        out["ppr_budget"] = k
    if max_accuracy_loss is not None:
        if isinstance(max_accuracy_loss, bool) or not isinstance(max_accuracy_loss, Real):
            raise InvalidArgumentError(f"max_accuracy_loss must be a number, got {max_accuracy_loss!r}")
        out["max_accuracy_loss"] = float(max_accuracy_loss)
    return out


def _min_version(value: int | None) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0:
        raise InvalidArgumentError(f"min_graph_version must be a non-negative integer, got {value!r}")
    return {"min_graph_version": int(value)} if int(value) else {}


def _edge_array_rows(edges: np.ndarray, what: str) -> list[list[Any]]:
    """The rows of an edge array. An array ``[k, 3]`` with weights is a float array, so its ids are floats:
    whole numbers among them are taken as ids (1.5 or NaN is refused, naming the row); a float id
    column beside no weights is refused like a float id anywhere else."""
    if edges.size == 0:
        return []
    if edges.ndim != 2:
        raise InvalidArgumentError(f"{what}: an edge array is [k, 2] or [k, 3], got shape {edges.shape}")
    rows: list[list[Any]] = edges.tolist()
    if edges.dtype.kind == "f" and edges.shape[1] == 3:
        ids = edges[:, :2]
        bad = np.flatnonzero(~np.all(np.isfinite(ids) & (ids == np.round(ids)), axis=1))
        if len(bad):
            i = int(bad[0])
            raise InvalidArgumentError(f"{what}[{i}]: node ids must be whole numbers, got {ids[i].tolist()}")
        rows = [[int(u), int(v), w] for u, v, w in rows]
    return rows


def _edge_list(edges: Any, what: str, weights: bool) -> list[pb.Edge]:
    """``Edge`` messages from pairs ``(u, v)`` / triples ``(u, v, w)`` or an array ``[k, 2]`` / ``[k, 3]``."""
    if edges is None:
        return []
    rows = _edge_array_rows(edges, what) if isinstance(edges, np.ndarray) else list(edges)
    out = []
    for i, e in enumerate(rows):
        try:
            parts = list(e)
        except TypeError:
            raise InvalidArgumentError(f"{what}[{i}]: an edge is a pair (u, v){' or a triple (u, v, w)' if weights else ''}, "
                                       f"got {e!r}") from None
        if len(parts) not in ((2, 3) if weights else (2,)):
            raise InvalidArgumentError(f"{what}[{i}]: an edge is a pair (u, v){' or a triple (u, v, w)' if weights else ''}, "
                                       f"got {len(parts)} values")
        ids = node_array(parts[:2])
        msg = pb.Edge(src=int(ids[0]), dst=int(ids[1]))
        if len(parts) == 3:
            w = parts[2]
            if isinstance(w, bool) or not isinstance(w, Real):
                raise InvalidArgumentError(f"{what}[{i}]: the weight must be a number, got {w!r}")
            msg.weight = float(w)
        out.append(msg)
    return out


def update_request(
    model: str, version: str, *, features: Any = None, new_nodes: Any = None, add_edges: Any = None,
    remove_edges: Any = None, expect_graph_version: int | None = None, request_id: str | None = None,
) -> pb.UpdateGraphRequest:
    """An ``UpdateGraphRequest`` from the SDK's arguments (see :meth:`clients.GnnClient.update_graph`)."""
    req = pb.UpdateGraphRequest(model=model, version=version, request_id=request_id or "")
    if features is not None:
        if isinstance(features, Mapping):
            items = list(features.items())
        else:
            try:
                ids, rows = features
            except (TypeError, ValueError):
                raise InvalidArgumentError("features must be a dict {node: row} or a pair (node_ids, rows [n, F])") from None
            ids = node_array(ids)
            rows = np.asarray(rows, dtype=np.float64)
            if rows.ndim != 2 or rows.shape[0] != len(ids):
                raise InvalidArgumentError(f"features: {len(ids)} node ids but rows of shape {rows.shape}")
            items = list(zip(ids.tolist(), rows, strict=True))
        for i, (node, row) in enumerate(items):
            ids = node_array(node)
            if len(ids) != 1:
                raise InvalidArgumentError(f"features[{i}]: one node id per row, got {node!r}")
            req.features.add(node=int(ids[0]), features=_float_list(row, f"features[{i}]"))
    if new_nodes is not None:
        req.new_nodes.extend(new_node_messages(new_nodes) if not isinstance(new_nodes, pb.NewNode) else [new_nodes])
    req.remove_edges.extend(_edge_list(remove_edges, "remove_edges", weights=False))
    req.add_edges.extend(_edge_list(add_edges, "add_edges", weights=True))
    if expect_graph_version is not None:
        if isinstance(expect_graph_version, bool) or not isinstance(expect_graph_version, Integral) \
                or int(expect_graph_version) < 0:
            raise InvalidArgumentError(f"expect_graph_version must be a non-negative integer, got {expect_graph_version!r}")
        req.expect_graph_version = int(expect_graph_version)
    return req


def update_result_from_pb(resp: pb.UpdateGraphResponse, client_ms: float) -> UpdateResult:
    return UpdateResult(graph_version=int(resp.graph_version),
                        new_node_ids=np.fromiter(resp.new_node_ids, dtype=np.int64, count=len(resp.new_node_ids)),
                        num_nodes=int(resp.num_nodes), num_edges=int(resp.num_edges), request_id=resp.request_id,
                        invalidated={k: int(v) for k, v in resp.invalidated.items()}, apply_ms=float(resp.apply_ms),
                        client_ms=client_ms)


def _float_list(values: Any, what: str) -> list[float]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{what} must be one-dimensional, got shape {arr.shape}")
    big = np.flatnonzero(np.isfinite(arr) & (np.abs(arr) > np.finfo(np.float32).max))
    if len(big):  # float32 on the wire: it would arrive as infinity (and NumPy would warn of the overflow)
        i = int(big[0])
        raise InvalidArgumentError(f"{what}[{i}]: {arr[i]:g} does not fit a float32 (largest magnitude "
                                   f"{float(np.finfo(np.float32).max):.4g})")
    return arr.astype(np.float32).tolist()


def has_new_nodes(new_nodes: Any) -> bool:
    """Whether a ``new_nodes`` argument names any node (None and an empty sequence do not)."""
    if new_nodes is None or isinstance(new_nodes, (NewNode, pb.NewNode)):
        return new_nodes is not None
    try:
        return len(new_nodes) > 0
    except TypeError:  # not a sequence: new_node_messages says what it takes
        return True


def new_node_messages(
    features: Any, neighbors: Any = None, edge_weights: Any = None
) -> list[pb.NewNode]:
    """``NewNode`` messages from one node (``features [F]``, ``neighbors [d]``), several
    (``features [m, F]``, ``neighbors`` a list of m id lists) or a list of :class:`NewNode`."""
    if isinstance(features, NewNode):
        features = [features]
    if isinstance(features, (list, tuple)) and features and all(isinstance(f, NewNode) for f in features):
        if neighbors is not None or edge_weights is not None:
            raise InvalidArgumentError("pass neighbours and weights inside the NewNode objects, not beside them")
        specs = [(f.features, f.neighbors, f.edge_weights) for f in features]
    else:
        if neighbors is None:
            raise InvalidArgumentError("neighbors is required (the new node's edges to existing node ids)")
        try:
            feats = np.asarray(features, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"features must be numbers: {exc}") from None
        if feats.ndim == 1:
            specs = [(feats, neighbors, edge_weights)]
        elif feats.ndim == 2:
            m = feats.shape[0]
            nbr_list = list(neighbors)
            if len(nbr_list) != m:
                raise InvalidArgumentError(f"{m} feature rows but {len(nbr_list)} neighbour lists")
            w_list = [None] * m if edge_weights is None else list(edge_weights)
            if len(w_list) != m:
                raise InvalidArgumentError(f"{m} feature rows but {len(w_list)} edge-weight lists")
            for name, values in (("neighbors", nbr_list), ("edge_weights", w_list)):
                # one id list per row: a flat list of m ids would otherwise read as one neighbour per new node
                flat = next((i for i, v in enumerate(values) if isinstance(v, (Real, np.number))), None)
                if flat is not None:
                    raise InvalidArgumentError(
                        f"with features [m, F] ({m} new nodes), {name} is a list of {m} lists, one per new node; "
                        f"{name}[{flat}] is a single number {values[flat]!r} (for one new node, pass features [F])")
            specs = [(feats[i], nbr_list[i], w_list[i]) for i in range(m)]
        else:
            raise InvalidArgumentError(f"features must be [F] or [m, F], got shape {feats.shape}")
    out = []
    for i, (f, nbrs, w) in enumerate(specs):
        try:
            msg = pb.NewNode(features=_float_list(f, f"new node {i}: features"),
                             neighbors=node_array(nbrs).tolist())
            if w is not None:
                msg.edge_weights.extend(_float_list(w, f"new node {i}: edge_weights"))
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"new node {i}: {exc.details}") from None
        out.append(msg)
    return out


# --------------------------------------------------------------------------- conversions
def model_info_from_pb(m: pb.ModelInfo) -> ModelInfo:
    return ModelInfo(
        name=m.name,
        version=m.version,
        versions=list(m.versions),
        architecture=m.architecture,
        extractor=m.extractor,
        num_features=int(m.num_features),
        num_classes=int(m.num_classes),
        num_nodes=int(m.num_nodes),
        max_ppr_budget=int(m.max_ppr_budget),
        default_sampling_width=int(m.default_sampling_width),
        default_ppr_budget=int(m.default_ppr_budget),
        max_sampling_width=int(m.max_sampling_width),
        max_nodes_per_request=int(m.max_nodes_per_request),
        strategy=m.strategy,
        knob_table=[
            KnobRow(
                ppr_budget=int(r.ppr_budget),
                sampling_width=int(r.sampling_width),
                val_accuracy=float(r.val_accuracy),
                latency_ms_per_node=float(r.latency_ms_per_node),
                edges_kept_fraction=float(r.edges_kept_fraction),
                agreement=float(r.agreement) if r.HasField("agreement") else None,
            )
            for r in m.knob_table
        ],
        metrics={k: float(v) for k, v in sorted(m.metrics.items())},
        dataset_fingerprint=m.dataset_fingerprint,
        ready=bool(m.ready),
        feature_store=m.feature_store,
        graph_version=int(m.graph_version),
        read_only=bool(m.read_only),
        max_request_work=int(m.max_request_work),
        max_new_node_edges=int(m.max_new_node_edges),
    )


def settings_from_pb(s: pb.Settings) -> Settings:
    return Settings(
        sampling_width=int(s.sampling_width),
        ppr_budget=int(s.ppr_budget),
        strategy=s.strategy,
        extractor=s.extractor,
        chosen_by=s.chosen_by,
        expected_accuracy=float(s.expected_accuracy),
        edges_kept=int(s.edges_kept),
        edges_total=int(s.edges_total),
    )


# --------------------------------------------------------------------------- chunking
@dataclass
class ChunkLimits:
    """What bounds one request: node count, request bytes, response bytes."""

    max_nodes: int
    request_bytes: int = REQUEST_BUDGET_BYTES
    response_bytes: int = int(RESPONSE_BUDGET_FRACTION * DEFAULT_MAX_MESSAGE_BYTES)
    num_classes: int | None = None
    embedding_dim: int | None = None


def _response_row_bytes(limits: ChunkLimits, probabilities: bool, embeddings: bool) -> int:
    row = LABEL_BYTES
    if probabilities:
        row += 4 * (limits.num_classes or 0)
    if embeddings:
        row += 4 * (limits.embedding_dim or 0)
    return row


def chunk_sizes(n: int, limits: ChunkLimits, *, probabilities: bool, embeddings: bool) -> list[int]:
    """Sizes of the requests a call of ``n`` existing nodes is split into (all but the last are equal).

    Example::

        >>> chunk_sizes(10, ChunkLimits(max_nodes=4), probabilities=True, embeddings=False)
        [4, 4, 2]
    """
    per = existing_chunk_size(limits, probabilities=probabilities, embeddings=embeddings)
    full, rest = divmod(n, per)
    return [per] * full + ([rest] if rest else [])


def existing_chunk_size(limits: ChunkLimits, *, probabilities: bool, embeddings: bool) -> int:
    """Largest number of existing node ids one request may carry under every limit (at least 1)."""
    k = max(1, limits.max_nodes)
    k = min(k, max(1, limits.request_bytes // NODE_ID_BYTES))
    k = min(k, max(1, limits.response_bytes // _response_row_bytes(limits, probabilities, embeddings)))
    if embeddings and limits.embedding_dim is None:
        k = min(k, FIRST_EMBEDDING_CHUNK)
    return k


def _packed(data: bytes, dtype: str, what: str) -> np.ndarray:
    if len(data) % 4:
        raise InternalError(f"server answered {len(data)} bytes of packed {what}, not a whole number of 4-byte values")
    return np.frombuffer(data, dtype=dtype)


def response_arrays(resp: pb.PredictResponse) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels (int64 ``[n]``), probabilities and embeddings (float32, flat) of one reply, packed
    (``resp.packed``: little-endian arrays in bytes fields) or as repeated fields (a server that
    predates packed outputs, or a request that did not ask for them)."""
    if resp.packed:
        return (_packed(resp.packed_labels, "<i4", "labels").astype(np.int64),
                _packed(resp.packed_probabilities, "<f4", "probabilities").astype(np.float32),
                _packed(resp.packed_embeddings, "<f4", "embeddings").astype(np.float32))
    return (np.fromiter(resp.labels, dtype=np.int64, count=len(resp.labels)),
            np.fromiter(resp.probabilities, dtype=np.float32, count=len(resp.probabilities)),
            np.fromiter(resp.embeddings, dtype=np.float32, count=len(resp.embeddings)))


#: what the server says when a request is too large for a limit a smaller request meets (serve.validation /
#: serve.wire: the per-request node limit; serve.runtime: the per-request work limit): :meth:`PredictPlan.shrink`
_NODE_LIMIT_REFUSAL = re.compile(r"request has (?:at least )?\d+ nodes, more than the limit of (\d+) per request")
_WORK_LIMIT_REFUSAL = re.compile(r"would aggregate about ([\d.e+]+) edges, more than the limit of ([\d.e+]+) per request")
_EDGE_LIMIT_REFUSAL = re.compile(r"new nodes have (?:at least )?(\d+) neighbours in all, more than the limit of (\d+) ")
WORK_SHRINK_MARGIN = 0.9


#: rounds of re-sending the chunks of a call answered at an older graph version than the newest of its chunks
#: (ClientOptions.max_version_rounds)
DEFAULT_MAX_VERSION_ROUNDS = 3


@dataclass
class _Chunk:
    """The rows of one request: existing ids ``nodes[start:end]`` or, with ``new``, ``new_nodes[start:end]``; and
    their answer once one came (``version``: the graph version that answered them)."""

    new: bool
    start: int
    end: int
    resent: bool = False  # queued again (or a piece of one queued again) to bring it to the newest graph version
    resp: pb.PredictResponse | None = None
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    version: int = 0

    @property
    def rows(self) -> int:
        return self.end - self.start


class PredictPlan:
    """Splits one SDK call into PredictRequests and reassembles the replies in order.

    Use: ``while (req := plan.next_request()) is not None: plan.add(send(req))``, then
    ``plan.result(client_ms)``. The call is pinned to the version that answered the first chunk,
    so a model version swapped in mid-call cannot mix two versions in one result.

    **One graph version per result.** A server answers each request from its newest graph, so the chunks of a
    call taking live updates can be answered at different graph versions. Every request after the first asks
    for at least the newest version seen so far (``min_graph_version``: also what keeps a replica behind from
    answering older). Once every chunk has been answered, chunks answered at an older version than the newest
    are sent again with ``min_graph_version`` = the newest, until all agree: a *version round*; none when no
    update landed during the call (no extra request). At most ``max_version_rounds`` rounds are made (a stream
    of updates can outrun them); the chunks still disagreeing then raise :class:`AbortedError`, unless
    ``allow_mixed_versions``: then nothing is re-sent and the result carries each row's version
    (``PredictResult.graph_versions``). Duplicate ids, new nodes and chunks split by :meth:`shrink` are covered
    alike: every row belongs to one chunk, and every chunk ends at the one version.
    """

    def __init__(
        self,
        *,
        model: str,
        version: str,
        nodes: np.ndarray,
        new_nodes: list[pb.NewNode],
        knobs: dict[str, Any],
        return_probabilities: bool,
        return_embeddings: bool,
        request_id: str,
        limits: ChunkLimits,
        packed: bool = True,
        max_version_rounds: int = DEFAULT_MAX_VERSION_ROUNDS,
        allow_mixed_versions: bool = False,
    ) -> None:
        self.packed = bool(packed)  # ask for packed outputs (decoded here; old servers answer repeated fields)
        self.model = model
        self.version = version
        self.nodes = nodes
        self.new_nodes = new_nodes
        self.knobs = knobs
        self.return_probabilities = bool(return_probabilities)
        self.return_embeddings = bool(return_embeddings)
        self.request_id = request_id
        self.limits = limits
        self.max_version_rounds = max(0, int(max_version_rounds))
        self.allow_mixed_versions = bool(allow_mixed_versions)
        #: version rounds made so far (see the class docstring)
        self.version_rounds = 0
        self._next_node = 0
        self._next_new = 0
        #: the index (in the call) of the first new node of the request in flight: the server numbers a request's
        #: new nodes from 0, and :meth:`located` puts its error messages back in the call's numbering
        self.new_offset = 0
        self._pending = 0  # rows of the request in flight
        self._chunks: list[_Chunk] = []  # in row order: existing ids, then new nodes
        self._inflight: _Chunk | None = None
        self._resend: list[_Chunk] = []  # chunks to send again (a version round), in order
        self._responses: list[pb.PredictResponse] = []  # every reply, superseded ones included (timing)
        self._sent_any = False
        #: the per-request node limit a server refusal named (see :meth:`shrink`), None until one did
        self.refused_node_limit: int | None = None

    @property
    def total(self) -> int:
        return len(self.nodes) + len(self.new_nodes)

    def _new_chunk_end(self) -> int:
        """End index of the next chunk of new nodes, packed greedily under the limits."""
        start = self._next_new
        row = _response_row_bytes(self.limits, self.return_probabilities, self.return_embeddings)
        max_nodes = max(1, self.limits.max_nodes)
        if self.return_embeddings and self.limits.embedding_dim is None:
            max_nodes = min(max_nodes, FIRST_EMBEDDING_CHUNK)
        req_bytes = resp_bytes = 0
        end = start
        while end < len(self.new_nodes) and end - start < max_nodes:
            size = self.new_nodes[end].ByteSize() + 6
            if end > start and (req_bytes + size > self.limits.request_bytes
                                or resp_bytes + row > self.limits.response_bytes):
                break
            req_bytes += size
            resp_bytes += row
            end += 1
        return end

    def _next_chunk(self) -> _Chunk | None:
        if self._resend:
            return self._resend.pop(0)
        if self._next_node < len(self.nodes):
            k = existing_chunk_size(self.limits, probabilities=self.return_probabilities,
                                    embeddings=self.return_embeddings)
            chunk = _Chunk(False, self._next_node, min(len(self.nodes), self._next_node + k))
            self._next_node = chunk.end
        elif self._next_new < len(self.new_nodes):
            # never beside existing ids: the server batches requests with new nodes apart, on the path that builds
            # induced subgraphs, where existing nodes would lose their faster paths
            chunk = _Chunk(True, self._next_new, self._new_chunk_end())
            self._next_new = chunk.end
        elif not self._sent_any:
            chunk = _Chunk(False, 0, 0)  # an empty call is still sent once, so the server answers it (INVALID_ARGUMENT)
        else:
            return self._version_round()
        self._chunks.append(chunk)
        return chunk

    def _version_round(self) -> _Chunk | None:
        """Every chunk answered: None when all were answered at one graph version (or mixed ones are allowed);
        else queue those answered at an older version than the newest again, and return the first of them."""
        newest = max((c.version for c in self._chunks), default=0)
        stale = [c for c in self._chunks if c.version != newest]
        if not stale or self.allow_mixed_versions:
            return None
        if self.version_rounds >= self.max_version_rounds:
            versions = sorted({c.version for c in self._chunks})
            rows = sum(c.rows for c in stale)
            raise AbortedError(
                f"the graph of model {self.model!r} was updated while this call's {len(self._chunks)} requests were "
                f"answered, and {rows} of its {self.total} rows still came from an older graph version than the "
                f"newest ({newest}; versions seen: {', '.join(map(str, versions))}) after {self.version_rounds} "
                f"round(s) of sending them again (ClientOptions.max_version_rounds): updates are arriving faster "
                "than the call can be answered at one version. Call again, send fewer nodes per call, or pass "
                "allow_mixed_versions=True to take each row at the version that answered it "
                "(PredictResult.graph_versions)",
                method="Predict",
            )
        self.version_rounds += 1
        log.debug("graph versions %s in one call: sending %d of %d requests again at version %d",
                  sorted({c.version for c in self._chunks}), len(stale), len(self._chunks), newest)
        self.knobs = {**self.knobs, "min_graph_version": max(newest, int(self.knobs.get("min_graph_version", 0)))}
        for c in stale:
            c.resent = True
        self._resend = stale
        return self._resend.pop(0)

    def next_request(self) -> pb.PredictRequest | None:
        """The next request to send, or None when every row has been answered (at one graph version, unless
        ``allow_mixed_versions``). Raises :class:`AbortedError` when the chunks still disagree after
        ``max_version_rounds`` version rounds."""
        if self._pending:
            raise RuntimeError("add() the reply of the previous request first")
        chunk = self._next_chunk()
        if chunk is None:
            return None
        req = pb.PredictRequest(
            model=self.model,
            version=self.version,
            return_probabilities=self.return_probabilities,
            return_embeddings=self.return_embeddings,
            packed_outputs=self.packed,
            **self.knobs,
        )
        if chunk.new:
            req.new_nodes.extend(self.new_nodes[chunk.start : chunk.end])
            self.new_offset = chunk.start
        else:
            req.nodes.extend(self.nodes[chunk.start : chunk.end].tolist())
            self.new_offset = 0
        self._inflight = chunk
        self._pending = chunk.rows
        i = len(self._responses)
        req.request_id = self.request_id if i == 0 else f"{self.request_id}/{i}"
        self._sent_any = True
        return req

    def shrink(self, exc: GnnServeError) -> bool:
        """After the request in flight failed with ``exc``: whether its rows will be sent again in smaller requests.

        True when the server refused the request for its size alone and it held more than one row: more nodes
        than the server's per-request limit (INVALID_ARGUMENT; the limit cached from an earlier GetModel is out of
        date, e.g. the server restarted with a smaller ``--max-nodes-per-request``), more new-node neighbours than
        its ``--max-new-node-edges`` (INVALID_ARGUMENT), or more estimated work than its ``--max-request-work``
        (RESOURCE_EXHAUSTED; an exact width on a large PPR budget, say). The plan is rewound to the start of that
        request and its rows per request capped (the named node limit, or the rows scaled by limit / amount with a
        margin); a request of one row is never split, so the loop ends. A request of a version round (sent again
        to reach the newest graph version; an update can raise its work) is split in place into requests of at
        most that many rows.
        """
        n = self._pending
        chunk = self._inflight
        if n <= 1 or chunk is None:
            return False
        cap: int | None = None
        if exc.code == grpc.StatusCode.INVALID_ARGUMENT and (m := _NODE_LIMIT_REFUSAL.search(exc.details)):
            cap = int(m.group(1))
            self.refused_node_limit = cap
        elif (exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and (m := _WORK_LIMIT_REFUSAL.search(exc.details))) or (
                exc.code == grpc.StatusCode.INVALID_ARGUMENT and (m := _EDGE_LIMIT_REFUSAL.search(exc.details))):
            try:
                work, limit = float(m.group(1)), float(m.group(2))
            except ValueError:
                work = limit = 0.0
            if work > 0 and limit > 0:  # the estimate is not linear in the rows (a repeated id counts once): leave a margin
                cap = int(WORK_SHRINK_MARGIN * n * limit / work)
        if cap is None:
            return False
        cap = max(1, min(cap, n - 1))
        log.debug("request of %d rows refused for its size (%s); sending them %d per request", n, exc.details, cap)
        self.limits.max_nodes = cap
        at = self._chunks.index(chunk)
        if chunk.resent:  # split in place; the pieces go next
            pieces = [_Chunk(chunk.new, s, min(chunk.end, s + cap), resent=True)
                      for s in range(chunk.start, chunk.end, cap)]
            self._chunks[at : at + 1] = pieces
            self._resend[:0] = pieces
        else:  # the frontier of the first pass: rewind to its start
            del self._chunks[at]
            if chunk.new:
                self._next_new = chunk.start
            else:
                self._next_node = chunk.start
        self._inflight = None
        self._pending = 0
        return True

    def located(self, exc: GnnServeError) -> GnnServeError:
        """``exc`` (the failure of the request in flight) with the new nodes its message names (``new_nodes[i]``, in
        the request's numbering) renumbered as in the call; ``exc`` itself when there is nothing to renumber."""
        if not self.new_offset or "new_nodes[" not in exc.details:
            return exc
        off = self.new_offset
        details = re.sub(r"new_nodes\[(\d+)\]", lambda m: f"new_nodes[{int(m.group(1)) + off}]", exc.details)
        return type(exc)(details, code=exc.code, method=exc.method, attempts=exc.attempts)

    def add(self, resp: pb.PredictResponse) -> None:
        """Record the reply to the last request from :meth:`next_request`."""
        n = self._pending
        chunk = self._inflight
        if chunk is None:
            raise RuntimeError("no request in flight")
        labels, probs, emb = response_arrays(resp)  # raises InternalError on a packed field of odd length
        if len(labels) != n:
            raise InternalError(f"server answered {len(labels)} labels for {n} nodes")
        c = int(resp.num_classes)
        if self.return_probabilities and len(probs) != n * c:
            raise InternalError(f"server answered {len(probs)} probabilities for {n} nodes x {c} classes")
        h = int(resp.embedding_dim)
        if self.return_embeddings and h and len(emb) != n * h:
            raise InternalError(f"server answered {len(emb)} embedding values for {n} nodes x {h}")
        if not self._responses:
            self.version = resp.version  # pin the rest of the call to this version
            if not self.request_id:
                self.request_id = resp.request_id
        chunk.resp, chunk.arrays, chunk.version = resp, (labels, probs, emb), int(resp.graph_version)
        if chunk.version > int(self.knobs.get("min_graph_version", 0)):
            # later requests: no older graph than the newest seen (a replica behind waits for it)
            self.knobs = {**self.knobs, "min_graph_version": chunk.version}
        self.limits.num_classes = c
        if self.return_embeddings:
            self.limits.embedding_dim = h
        self._responses.append(resp)
        self._inflight = None
        self._pending = 0

    def result(self, client_ms: float) -> PredictResult:
        """Reassembled result (call after :meth:`next_request` returned None)."""
        if not self._responses or self._pending or any(ch.resp is None for ch in self._chunks):
            raise RuntimeError("no reply recorded" if not self._responses else "the call is not finished")
        chunks = self._chunks
        rs = [cast(pb.PredictResponse, ch.resp) for ch in chunks]
        arrays = [cast(tuple[np.ndarray, np.ndarray, np.ndarray], ch.arrays) for ch in chunks]
        first = rs[0]
        c = int(first.num_classes)
        labels = np.concatenate([a[0] for a in arrays])
        probs = None
        if self.return_probabilities:
            probs = np.concatenate([a[1] for a in arrays]).reshape(len(labels), c)
        emb = None
        if self.return_embeddings and all(r.embedding_dim for r in rs):
            h = int(first.embedding_dim)
            emb = np.concatenate([a[2] for a in arrays]).reshape(len(labels), h)
        s = settings_from_pb(first.settings)
        if len(rs) > 1:
            s = Settings(**{**s.to_dict(), "edges_kept": sum(int(r.settings.edges_kept) for r in rs),
                            "edges_total": sum(int(r.settings.edges_total) for r in rs)})
        sent = self._responses  # server time spent on the call: superseded replies included
        timing = Timing(
            queue_ms=math.fsum(r.timing.queue_ms for r in sent),
            subgraph_ms=math.fsum(r.timing.subgraph_ms for r in sent),
            features_ms=math.fsum(r.timing.features_ms for r in sent),
            forward_ms=math.fsum(r.timing.forward_ms for r in sent),
            total_ms=math.fsum(r.timing.total_ms for r in sent),
            batch_size=max(int(r.timing.batch_size) for r in sent),
            chunks=len(sent),
            client_ms=client_ms,
            version_rounds=self.version_rounds,
        )
        graph_versions = np.repeat(np.array([ch.version for ch in chunks], dtype=np.int64),
                                   [ch.rows for ch in chunks])
        return PredictResult(
            labels=labels,
            probabilities=probs,
            embeddings=emb,
            settings=s,
            timing=timing,
            model=first.model,
            version=first.version,
            request_id=self.request_id,
            nodes=self.nodes.copy(),
            num_classes=c,
            data_version=" | ".join(dict.fromkeys(r.data_version for r in rs)),
            graph_version=max(ch.version for ch in chunks),
            served_by=" | ".join(dict.fromkeys(r.served_by for r in rs if r.served_by)),
            graph_versions=graph_versions,
        )


# --------------------------------------------------------------------------- retries and deadlines
#: what an UNAVAILABLE over TLS adds: a plaintext server fails the handshake, which gRPC reports as unreachable
TLS_HINT = ("this client uses TLS: a server that serves plaintext fails the handshake and looks unreachable; "
            "connect to such a server without TLS")

#: the longest deadline an RPC is sent with (about 3 years); a longer SDK or CLI timeout, infinity included, means
#: no practical deadline (gRPC fails a deadline past about 3e9 s at once with DEADLINE_EXCEEDED)
MAX_RPC_TIMEOUT_S = 1e8

@dataclass
class RetryState:
    """Retry bookkeeping for one SDK call: its RPCs share the deadline; each RPC gets ``max_retries``."""

    method: str
    timeout: float | None
    max_retries: int
    backoff: Backoff
    retry_codes: frozenset[grpc.StatusCode]
    rand: random.Random = field(default_factory=random.Random)
    attempts: int = 0
    retries: int = 0
    started: float = field(default_factory=time.monotonic)
    unavailable_hint: str = ""  # said after an UNAVAILABLE's details (TLS_HINT on a TLS channel)
    wait_for_ready: bool = False  # ClientOptions.wait_for_ready (never for a health check)

    @property
    def deadline(self) -> float | None:
        return None if self.timeout is None else self.started + self.timeout

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None = no deadline); raises once it has passed."""
        if self.timeout is None:
            return None
        left = self.started + self.timeout - time.monotonic()
        if left <= 0:
            raise DeadlineExceededError(
                f"deadline of {self.timeout:g} s passed before {self.method} could be sent"
                f" (after {self.attempts} attempt(s))",
                method=self.method,
                attempts=self.attempts,
            )
        # gRPC turns a deadline past about 3e9 s (or infinity) into one already passed: a longer one is as good as none
        return min(left, MAX_RPC_TIMEOUT_S)

    def failed(self, err: grpc.RpcError) -> float:
        """Record a failed attempt: the delay before retrying, or raise the typed error."""
        code_fn = getattr(err, "code", None)
        code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
        details_fn = getattr(err, "details", None)
        details = (details_fn() if callable(details_fn) else None) or f"{self.method} failed ({code.name})"
        return self.failed_with(code, details)

    def failed_with(self, code: grpc.StatusCode, details: str) -> float:
        # a request over the work limit is refused the same way every time: no retry (PredictPlan.shrink splits it)
        deterministic = code == grpc.StatusCode.RESOURCE_EXHAUSTED and _WORK_LIMIT_REFUSAL.search(details) is not None
        # wait_for_ready: a server that listens but is still loading its models (a restart) answers UNAVAILABLE for
        # seconds; such a call waits for it as for the connection, until its deadline, max_retries aside
        waiting = self.wait_for_ready and code == grpc.StatusCode.UNAVAILABLE
        if code in self.retry_codes and (self.retries < self.max_retries or waiting) and not deterministic:
            delay = self.backoff.delay(self.retries, self.rand.random())
            left = None if self.deadline is None else self.deadline - time.monotonic()
            if left is None or left > delay:
                self.retries += 1
                log.debug("%s failed %s (%s); retry %d/%d in %.3f s", self.method, code.name, details,
                          self.retries, self.max_retries, delay)
                return delay
        raise self.error(code, details)

    def error(self, code: grpc.StatusCode, details: str) -> GnnServeError:
        if code == grpc.StatusCode.UNAVAILABLE and self.unavailable_hint:
            details = f"{details} ({self.unavailable_hint})"
        return error_for_code(code, details, method=self.method, attempts=self.attempts)
