"""The client side of the ``gnnserve`` command: ``gnnserve predict``, ``gnnserve models`` and ``gnnserve update``.

``serve.cli`` hands these subcommands to :func:`predict_main`, :func:`models_main` and
:func:`update_main`, which return the exit code: 0 on success, 2 for bad arguments or
``INVALID_ARGUMENT``, 1 for any other failure. Failures print ``gnnserve <cmd>: CODE: message`` (or
``gnnserve <cmd>: error: ...`` for bad arguments) on stderr, without a traceback. ``--server HOST``
alone means port 8500 (:func:`server_address`). Options are never abbreviated (``allow_abbrev=False``):
argparse's prefix matching would read ``--k 32`` as ``--key 32``, the TLS key file.

Examples::

    gnnserve predict --server 127.0.0.1:8500 --model cora-sage --nodes 0-9,42 --width 16 --budget 64
    gnnserve predict --server 127.0.0.1:8500 --model cora-sage --nodes @ids.txt --json
    gnnserve models --server 127.0.0.1:8500
    echo '{"add_edges": [[1, 2]], "features": {"7": [0.1, 0.2]}}' | gnnserve update --model cora-gcn -
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ._core import DEFAULT_PORT, server_address
from .client import GnnClient
from .errors import GnnServeError, InvalidArgumentError
from .types import ModelInfo, NewNode, PredictResult

__all__ = ["NodeSpecError", "models_main", "parse_nodes", "predict_main", "read_updates", "server_address",
           "update_main"]

DEFAULT_SERVER = f"127.0.0.1:{DEFAULT_PORT}"
MAX_RANGE = 50_000_000  # ids in one --nodes range: a typo like 0-9999999999 should not eat the memory
INT64_MAX = (1 << 63) - 1  # node ids travel as int64


class NodeSpecError(ValueError):
    """A ``--nodes`` value that cannot be read."""


def _too_large(digits: str) -> bool:
    """Whether a string of ASCII digits is a number beyond int64 (checked on the text first, so a
    thousand-digit typo is not converted at all)."""
    digits = digits.lstrip("0")
    return len(digits) > 19 or (len(digits) == 19 and int(digits) > INT64_MAX)


def _parse_id(text: str, where: str) -> int:
    t = text.strip()
    if not (t.isascii() and t.isdigit()):
        raise NodeSpecError(f"{where}: {t!r} is not a node id (a non-negative integer)")
    if _too_large(t):
        raise NodeSpecError(f"{where}: node id {t[:30]}{'...' if len(t) > 30 else ''} is too large: "
                            f"node ids must fit int64 (at most {INT64_MAX})")
    return int(t)


def _parse_part(part: str, where: str) -> np.ndarray:
    if part.startswith("-"):
        raise NodeSpecError(f"{where}: {part!r}: node ids are non-negative")
    if "-" in part:
        lo_s, _, hi_s = part.partition("-")
        lo, hi = _parse_id(lo_s, where), _parse_id(hi_s, where)
        if hi < lo:
            raise NodeSpecError(f"{where}: range {part!r} is empty (the end comes before the start)")
        if hi - lo + 1 > MAX_RANGE:
            raise NodeSpecError(f"{where}: range {part!r} has {hi - lo + 1} ids, more than {MAX_RANGE}")
        return np.arange(lo, hi + 1, dtype=np.int64)
    return np.array([_parse_id(part, where)], dtype=np.int64)


def parse_nodes(spec: str, *, base_dir: str | os.PathLike[str] | None = None) -> np.ndarray:
    """Node ids from a ``--nodes`` value, in order (duplicates kept).

    Comma-separated items, each an id (``7``), an inclusive range (``0-99``) or ``@FILE``: a text
    file with one id or range per line (blank lines and ``#`` comments are skipped).

    Example::

        >>> parse_nodes("3,0-2,3").tolist()
        [3, 0, 1, 2, 3]
    """
    parts: list[np.ndarray] = []
    items = [p.strip() for p in spec.split(",")]
    if not spec.strip():
        raise NodeSpecError("--nodes is empty")
    for item in items:
        if not item:
            raise NodeSpecError(f"--nodes {spec!r}: empty item between commas")
        if item.startswith("@"):
            path = Path(item[1:])
            if base_dir is not None and not path.is_absolute():
                path = Path(base_dir) / path
            try:
                text = path.read_text()
            except OSError as exc:
                raise NodeSpecError(f"cannot read node file {str(path)!r}: {exc.strerror or exc}") from None
            count = 0
            for lineno, line in enumerate(text.splitlines(), 1):
                line = line.split("#", 1)[0].strip()
                if line:
                    parts.append(_parse_part(line, f"{path}:{lineno}"))
                    count += 1
            if count == 0:
                raise NodeSpecError(f"node file {str(path)!r} has no ids")
        else:
            parts.append(_parse_part(item, "--nodes"))
    return np.concatenate(parts)


# --------------------------------------------------------------------------- shared options
def _connection_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("connection")
    g.add_argument("--server", default=os.environ.get("GNNSERVE_SERVER", DEFAULT_SERVER),
                   help=f"HOST:PORT of the server, port {DEFAULT_PORT} when only HOST is given "
                        f"(default: $GNNSERVE_SERVER or {DEFAULT_SERVER})")
    security_args(g)
    g.add_argument("--timeout", type=float, default=30.0, metavar="SEC", help="deadline per command (default 30)")
    g.add_argument("--retries", type=int, default=3, help="retries when the server is unavailable (default 3)")


def security_args(g: Any) -> None:
    """The TLS and bearer-token options of every command that calls a server (``g``: a parser or a group)."""
    g.add_argument("--tls", action="store_true", help="use TLS (verify the server against --ca or the system roots)")
    g.add_argument("--ca", metavar="FILE", help="CA certificate (PEM) to verify the server with; implies --tls")
    g.add_argument("--cert", metavar="FILE", help="client certificate (PEM) for mutual TLS; with --key")
    g.add_argument("--key", metavar="FILE", help="client private key (PEM) for mutual TLS; with --cert")
    g.add_argument("--server-name", metavar="NAME", help="name to expect in the server's certificate")
    g.add_argument("--token-file", metavar="FILE",
                   help="file holding the bearer token (default: $GNNSERVE_TOKEN when set)")


class _UsageError(Exception):
    pass


def security_options(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`security_args`' values as :class:`GnnClient` keywords (``ValueError`` with a user's message
    for an unreadable or empty token file, or ``--cert`` without ``--key``)."""
    token = None
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read --token-file {args.token_file!r}: {exc.strerror or exc}") from None
        if not token:
            raise ValueError(f"--token-file {args.token_file!r} is empty")
    elif os.environ.get("GNNSERVE_TOKEN"):
        token = os.environ["GNNSERVE_TOKEN"]
    if bool(args.cert) != bool(args.key):
        raise ValueError("--cert and --key go together")
    return {"tls": args.tls, "root_certificates": Path(args.ca) if args.ca else None,
            "client_cert": Path(args.cert) if args.cert else None,
            "client_key": Path(args.key) if args.key else None,
            "tls_server_name": args.server_name, "token": token}


def _client(args: argparse.Namespace, **extra: Any) -> GnnClient:
    try:
        security = security_options(args)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    if args.timeout is not None and not args.timeout > 0:
        raise _UsageError(f"--timeout must be > 0, got {args.timeout}")
    if args.retries < 0:
        raise _UsageError(f"--retries must be >= 0, got {args.retries}")
    try:
        return GnnClient(server_address(args.server), timeout=args.timeout, max_retries=args.retries, **security,
                         **extra)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def _run(prog: str, build: Callable[[], argparse.ArgumentParser], argv: Sequence[str] | None,
         body: Callable[[argparse.Namespace, TextIO], int]) -> int:
    ap = build()
    try:
        args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse printed usage (code 2) or help (code 0)
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        return body(args, sys.stdout)
    except (_UsageError, NodeSpecError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except GnnServeError as exc:
        print(f"{prog}: {exc.code.name}: {exc.details}", file=sys.stderr)
        if exc.attempts > 1:
            print(f"{prog}: (gave up after {exc.attempts} attempts)", file=sys.stderr)
        return 2 if isinstance(exc, InvalidArgumentError) else 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`
        return 0


def _model_version(text: str) -> str | None:
    """An argparse type for ``--version``: a version number as given, or ``latest`` (any case) for None,
    the newest loaded version. The server itself knows versions by number only (docs/RELIABILITY.md: a
    request naming version "latest" is NOT_FOUND); the word is the help's own, so the command takes it."""
    return None if text.strip().lower() == "latest" else text


def _version_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--version", type=_model_version, default=None,
                    help="model version: a number, or 'latest' for the newest loaded one (default: latest)")


# --------------------------------------------------------------------------- predict
def _predict_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gnnserve predict",
        allow_abbrev=False,
        description="Classify nodes with a model on a gnnserve server.",
        epilog="--nodes takes ids, inclusive ranges and @FILE (one id or range per line), comma-separated: "
               "e.g. --nodes 0-9,42,@more.txt. --new-nodes FILE: nodes that are not in the graph, one JSON object "
               'per line or a JSON array, e.g. {"features": [0.3, 0.1], "neighbors": [1, 2], "edge_weights": '
               "[1.0, 0.5]} (weights optional); they are classified with the graph as it is, which they do not "
               "change ('gnnserve update' adds nodes), and printed after --nodes' rows as new[0], new[1], ...",
    )
    ap.add_argument("--model", required=True, help="model name (see 'gnnserve models')")
    ap.add_argument("--nodes", default=None, help="node ids: 1,2,3 / 0-99 / @FILE (combinable)")
    ap.add_argument("--new-nodes", default=None, metavar="FILE",
                    help="new nodes to classify (JSON lines or a JSON array, '-' for stdin); with or without --nodes")
    _version_arg(ap)
    ap.add_argument("--width", type=int, default=None, metavar="S", help="sampling width S (0 = exact)")
    ap.add_argument("--budget", type=int, default=None, metavar="K", help="PPR budget K (subgraph size)")
    ap.add_argument("--max-accuracy-loss", type=float, default=None, metavar="L",
                    help="let the server pick the fastest knobs within L (0.01 = 1 point) of exact")
    ap.add_argument("--probabilities", action="store_true", help="print every class probability")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--request-id", default=None, help="id the server logs for this call")
    ap.add_argument("--max-nodes-per-call", type=int, default=None, help="split requests into at most this many nodes (default: the server's per-request limit)")
    ap.add_argument("--min-graph-version", type=int, default=None, metavar="V",
                    help="answer only from a graph at version V or newer (what 'gnnserve update' printed)")
    _connection_args(ap)
    return ap


def format_result(res: PredictResult, *, probabilities: bool = False) -> str:
    """The readable table ``gnnserve predict`` prints.

    Example::

        print(format_result(client.predict("cora-sage", [0, 1])))
    """
    lines = [f"model {res.model}  version {res.version}  graph version {res.graph_version}  "
             f"request {res.request_id}  nodes {len(res)}"]
    top = res.top_probabilities
    header = f"{'node':>10}  {'label':>5}"
    if top is not None:
        header += f"  {'p(label)':>8}"
    if probabilities and res.probabilities is not None:
        header += "  " + "  ".join(f"{'p' + str(c):>6}" for c in range(res.probabilities.shape[1]))
    lines.append(header)
    n_old = len(res.nodes)
    for i in range(len(res)):
        node = str(int(res.nodes[i])) if i < n_old else f"new[{i - n_old}]"
        row = f"{node:>10}  {int(res.labels[i]):>5}"
        if top is not None:
            row += f"  {float(top[i]):>8.4f}"
        if probabilities and res.probabilities is not None:
            row += "  " + "  ".join(f"{float(p):>6.4f}" for p in res.probabilities[i])
        lines.append(row)
    s, t = res.settings, res.timing
    budget = str(s.ppr_budget) if s.ppr_budget else "n/a"
    width = str(s.sampling_width) if s.sampling_width else "exact"
    expected = f"{s.expected_accuracy:.4f}" if s.expected_accuracy else "n/a"
    lines.append(
        f"settings: sampling_width={width} ppr_budget={budget} strategy={s.strategy} extractor={s.extractor} "
        f"chosen_by={s.chosen_by} expected_accuracy={expected} "
        f"edges_kept={s.edges_kept}/{s.edges_total} ({100 * s.edges_kept_fraction:.1f}%)"
    )
    chunks = f" over {t.chunks} requests (summed)" if t.chunks > 1 else ""
    lines.append(
        f"timing:   server {t.total_ms:.2f} ms{chunks} (queue {t.queue_ms:.2f}, subgraph {t.subgraph_ms:.2f}, "
        f"features {t.features_ms:.2f}, forward {t.forward_ms:.2f}; batch {t.batch_size}); "
        f"client {t.client_ms:.2f} ms"
    )
    answered = [f"served_by={res.served_by}"] if res.served_by else []
    if res.data_version:
        answered.append(f"data_version={res.data_version}")
    if answered:
        lines.append("answered: " + " ".join(answered))
    return "\n".join(lines)


def result_dict(res: PredictResult, *, probabilities: bool = False) -> dict[str, Any]:
    """The JSON object ``gnnserve predict --json`` prints: :meth:`PredictResult.to_dict` (with the graph
    version that answered and the process that served it)."""
    return res.to_dict(probabilities=probabilities, embeddings=False)


def _predict(args: argparse.Namespace, out: TextIO) -> int:
    if args.nodes is None and args.new_nodes is None:
        raise _UsageError("give --nodes (ids in the graph), --new-nodes FILE (nodes not in it), or both")
    nodes = parse_nodes(args.nodes) if args.nodes is not None else np.zeros(0, dtype=np.int64)
    new = None
    if args.new_nodes is not None:
        text, where = _read_input(args.new_nodes)
        new = [_json_new_node(node, place) for place, node in _json_objects(text, where, "a new node", _NEW_NODE_KEYS)]
    if args.max_nodes_per_call is not None and args.max_nodes_per_call < 1:
        raise _UsageError(f"--max-nodes-per-call must be >= 1, got {args.max_nodes_per_call}")
    with _client(args, max_nodes_per_call=args.max_nodes_per_call) as client:
        res = client.predict(
            args.model,
            nodes,
            sampling_width=args.width,
            ppr_budget=args.budget,
            max_accuracy_loss=args.max_accuracy_loss,
            return_probabilities=True,
            version=args.version,
            request_id=args.request_id,
            min_graph_version=args.min_graph_version,
            new_nodes=new,
        )
    if args.json:
        json.dump(result_dict(res, probabilities=args.probabilities), out)
        out.write("\n")
    else:
        out.write(format_result(res, probabilities=args.probabilities) + "\n")
    return 0


def predict_main(argv: Sequence[str] | None = None) -> int:
    """``gnnserve predict``: returns the exit code (0 ok, 2 bad arguments / INVALID_ARGUMENT, 1 other errors).

    Example::

        predict_main(["--server", "127.0.0.1:8500", "--model", "cora-sage", "--nodes", "0-4", "--json"])
    """
    return _run("gnnserve predict", _predict_parser, argv, _predict)


# --------------------------------------------------------------------------- models
def _models_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gnnserve models", allow_abbrev=False,
                                 description="List a server's models (every loaded version) with their knob tables.")
    ap.add_argument("--model", default=None, help="show only this model")
    ap.add_argument("--json", action="store_true", help="print a JSON list instead of tables")
    _connection_args(ap)
    return ap


def format_model(info: ModelInfo) -> str:
    """The block ``gnnserve models`` prints for one model version.

    Example::

        print(format_model(client.get_model("cora-sage")))
    """
    budget = f" max_ppr_budget={info.max_ppr_budget} default_ppr_budget={info.default_ppr_budget}" \
        if info.extractor == "ppr" else ""
    # the graph version: what 'gnnserve update' prints after each update and what an update whose answer was
    # lost is checked against; read-only: the server refuses UpdateGraph for this model
    writes = "  read-only (updates refused)" if info.read_only else ""
    lines = [
        f"{info.name}  version {info.version} (loaded: {', '.join(info.versions) or info.version})"
        f"  {'ready' if info.ready else 'NOT READY'}  graph version {info.graph_version}{writes}",
        f"  {info.architecture}, extractor {info.extractor}, strategy {info.strategy}, "
        f"{info.num_nodes} nodes, {info.num_features} features, {info.num_classes} classes, "
        f"features from {info.feature_store}",
        f"  default_sampling_width={info.default_sampling_width} max_sampling_width={info.max_sampling_width}"
        f"{budget} max_nodes_per_request={info.max_nodes_per_request}"
        + (f" max_request_work={info.max_request_work} max_new_node_edges={info.max_new_node_edges}"
           if info.max_request_work else ""),
    ]
    if info.metrics:
        lines.append("  metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in info.metrics.items()))
    if info.knob_table:
        lines.append(f"  {'ppr_budget':>10}  {'width':>6}  {'val_acc':>7}  {'agreement':>9}  {'ms/node':>8}  "
                     f"{'edges kept':>10}")
        for r in info.knob_table:
            k = str(r.ppr_budget) if r.ppr_budget else "n/a"
            s = str(r.sampling_width) if r.sampling_width else "exact"
            agree = "-" if r.agreement is None else f"{r.agreement:.4f}"
            lines.append(f"  {k:>10}  {s:>6}  {r.val_accuracy:>7.4f}  {agree:>9}  {r.latency_ms_per_node:>8.4f}  "
                         f"{100 * r.edges_kept_fraction:>9.1f}%")
    else:
        lines.append("  (no knob table)")
    return "\n".join(lines)


def _models(args: argparse.Namespace, out: TextIO) -> int:
    with _client(args) as client:
        infos = client.list_models()
    if args.model is not None:
        infos = [m for m in infos if m.name == args.model]
        if not infos:
            print(f"gnnserve models: NOT_FOUND: no model {args.model!r} on {args.server}", file=sys.stderr)
            return 1
    if args.json:
        json.dump([m.to_dict() for m in infos], out)
        out.write("\n")
    elif not infos:
        out.write(f"no models loaded on {args.server}\n")
        with _client(args) as client:  # why: the repository's versions that are not served
            for m in client.repository_index():
                if args.model is None or m["name"] == args.model:
                    out.write(f"  {m['name']} v{m['version']}: {m['state']}, {m['reason'] or 'no reason given'}\n")
    else:
        out.write("\n\n".join(format_model(m) for m in infos) + "\n")
    return 0


def models_main(argv: Sequence[str] | None = None) -> int:
    """``gnnserve models``: returns the exit code (0 ok, 1 on errors, 2 for bad arguments).

    Example::

        models_main(["--server", "127.0.0.1:8500", "--json"])
    """
    return _run("gnnserve models", _models_parser, argv, _models)


# --------------------------------------------------------------------------- update
_UPDATE_KEYS = {"features", "new_nodes", "add_edges", "remove_edges", "expect_graph_version", "request_id"}
_NEW_NODE_KEYS = {"features", "neighbors", "edge_weights"}
# a failed update with one of these codes was refused by the server: it was not applied
_REFUSED = {"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
            "RESOURCE_EXHAUSTED", "PERMISSION_DENIED", "UNAUTHENTICATED", "UNIMPLEMENTED"}


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' object hook: a key given twice is an error (JSON itself would keep the last silently)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def _parse_updates(text: str, where: str) -> list[tuple[str, dict[str, Any]]]:
    """``(place, object)`` per update of an update file; ``place`` is ``FILE:LINE`` (JSON lines) or
    ``FILE: item I`` (a JSON array)."""
    return _json_objects(text, where, "an update", _UPDATE_KEYS)


def _json_objects(text: str, where: str, kind: str, keys: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """``(place, object)`` per object of a file of ``kind`` objects (one per line, blank lines and ``#`` comments
    skipped, or one JSON array), each with fields of ``keys`` only; ``place`` is ``FILE:LINE`` or ``FILE: item
    I``."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            raise _UsageError(f"{where}: not valid JSON: {exc}") from None
        except _DuplicateKey as exc:
            raise _UsageError(f"{where}: {exc}") from None
        places = [f"{where}: item {i}" for i in range(len(items))]
    else:
        items, places = [], []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                items.append(json.loads(line, object_pairs_hook=_unique_keys))
            except json.JSONDecodeError as exc:
                raise _UsageError(f"{where}:{n}: not valid JSON: {exc}") from None
            except _DuplicateKey as exc:
                raise _UsageError(f"{where}:{n}: {exc}") from None
            places.append(f"{where}:{n}")
    for item, place in zip(items, places, strict=True):
        if not isinstance(item, dict):
            raise _UsageError(f"{place}: {kind} is a JSON object, got {type(item).__name__}")
        unknown = set(item) - keys
        if unknown:
            raise _UsageError(f"{place}: unknown field(s) {sorted(unknown)}; {kind} has {sorted(keys)}")
    if not items:
        raise _UsageError(f"{where}: no {kind.split(' ', 1)[1]}s in it")
    return list(zip(places, items, strict=True))


def read_updates(text: str, where: str = "<updates>") -> list[dict[str, Any]]:
    """The updates of an update file: one JSON object per line (blank lines and ``#`` comments
    skipped), or one JSON array of objects. Each object has any of ``features`` (``{"node": [F
    floats]}``), ``new_nodes`` (``[{"features": [...], "neighbors": [...], "edge_weights": [...]}]``),
    ``add_edges`` (``[[u, v]]`` or ``[[u, v, w]]``), ``remove_edges`` (``[[u, v]]``),
    ``expect_graph_version`` and ``request_id``; each object is one atomic update.

    Example::

        >>> read_updates('{"add_edges": [[1, 2]]}')
        [{'add_edges': [[1, 2]]}]
    """
    return [item for _, item in _parse_updates(text, where)]


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_id(value: Any, what: str) -> int:
    """A node id from JSON: an integer (not ``true``/``false``, not ``1.0``), non-negative, within int64."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _UsageError(f"{what}: {_shown(value)} is not a node id (a non-negative integer)")
    if value < 0:
        raise _UsageError(f"{what}: {value}: node ids are non-negative")
    if value > INT64_MAX:
        raise _UsageError(f"{what}: node id {_shown(value)} is too large: node ids must fit int64 (at most {INT64_MAX})")
    return value


def _json_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _UsageError(f"{what}: {_shown(value)} is not a number")
    try:
        return float(value)
    except OverflowError:
        raise _UsageError(f"{what}: {_shown(value)} is too large for a float") from None


def _json_numbers(value: Any, what: str) -> list[float]:
    if not isinstance(value, list):
        raise _UsageError(f"{what}: expected a list of numbers, got {_shown(value)}")
    return [_json_number(v, f"{what}[{i}]") for i, v in enumerate(value)]


def _json_ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list):
        raise _UsageError(f"{what}: expected a list of node ids, got {_shown(value)}")
    return [_json_id(v, f"{what}[{i}]") for i, v in enumerate(value)]


def _json_edges(value: Any, what: str, *, weights: bool) -> list[tuple[Any, ...]]:
    shape = "[u, v] or [u, v, weight]" if weights else "[u, v]"
    if not isinstance(value, list):
        raise _UsageError(f"{what}: expected a list of edges {shape}, got {_shown(value)}")
    out: list[tuple[Any, ...]] = []
    for i, edge in enumerate(value):
        if not isinstance(edge, list) or len(edge) not in ((2, 3) if weights else (2,)):
            raise _UsageError(f"{what}[{i}]: an edge is {shape}, got {_shown(edge)}")
        ends = (_json_id(edge[0], f"{what}[{i}][0]"), _json_id(edge[1], f"{what}[{i}][1]"))
        out.append((*ends, _json_number(edge[2], f"{what}[{i}][2]")) if len(edge) == 3 else ends)
    return out


def _json_new_node(node: Any, what: str) -> NewNode:
    """A :class:`~clients.types.NewNode` from a JSON object ``{"features": [numbers], "neighbors": [ids],
    "edge_weights": [numbers]}`` (neighbours and weights optional), each value checked for its JSON type."""
    if not isinstance(node, dict) or "features" not in node:
        raise _UsageError(f'{what}: a new node is an object {{"features": [numbers], "neighbors": [ids], '
                          f'"edge_weights": [numbers]}}, got {_shown(node)}')
    unknown = set(node) - _NEW_NODE_KEYS
    if unknown:
        raise _UsageError(f"{what}: unknown field(s) {sorted(unknown)}; a new node has {sorted(_NEW_NODE_KEYS)}")
    weights = node.get("edge_weights")
    return NewNode(features=_json_numbers(node["features"], f"{what}.features"),
                   neighbors=_json_ids(node.get("neighbors", []), f"{what}.neighbors"),
                   edge_weights=None if weights is None else _json_numbers(weights, f"{what}.edge_weights"))


def _update_args(item: dict[str, Any], place: str) -> dict[str, Any]:
    """The keyword arguments of :meth:`GnnClient.update_graph` for one update object, every value
    checked for its JSON type here (a usage error naming ``place`` and the entry) before anything
    is sent; the server checks the rest (ids in range, edges present or absent, row lengths)."""
    kw: dict[str, Any] = {}
    feats = item.get("features")
    if feats is not None:
        if not isinstance(feats, dict):
            raise _UsageError(f"{place}: features must be an object {{\"node\": [numbers]}}, got {_shown(feats)}")
        rows: dict[int, list[float]] = {}
        for key, row in feats.items():
            k = key.strip()
            if not (k.isascii() and k.isdigit()):
                raise _UsageError(f"{place}: features: key {key!r} is not a node id (a non-negative integer)")
            if _too_large(k):
                raise _UsageError(f"{place}: features: node id {_shown(key)} is too large: node ids must fit int64")
            if int(k) in rows:
                raise _UsageError(f"{place}: features: node {int(k)} appears twice (key {key!r}); give each node's "
                                  "row once")
            rows[int(k)] = _json_numbers(row, f"{place}: features[{key!r}]")
        kw["features"] = rows
    nodes = item.get("new_nodes")
    if nodes is not None:
        if not isinstance(nodes, list):
            raise _UsageError(f"{place}: new_nodes must be a list of objects, got {_shown(nodes)}")
        new = [_json_new_node(node, f"{place}: new_nodes[{j}]") for j, node in enumerate(nodes)]
        if new:
            kw["new_nodes"] = new
    if item.get("add_edges") is not None:
        kw["add_edges"] = _json_edges(item["add_edges"], f"{place}: add_edges", weights=True)
    if item.get("remove_edges") is not None:
        kw["remove_edges"] = _json_edges(item["remove_edges"], f"{place}: remove_edges", weights=False)
    expect = item.get("expect_graph_version")
    if expect is not None:
        if isinstance(expect, bool) or not isinstance(expect, int) or not 0 <= expect < 1 << 64:
            raise _UsageError(f"{place}: expect_graph_version must be a non-negative integer, got {_shown(expect)}")
        kw["expect_graph_version"] = expect
    rid = item.get("request_id")
    if rid is not None:
        if not isinstance(rid, str):
            raise _UsageError(f"{place}: request_id must be a string, got {_shown(rid)}")
        kw["request_id"] = rid
    return kw


def _update_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gnnserve update",
        allow_abbrev=False,
        description="Apply graph updates (features, new nodes, edge additions and removals) to the graph a model "
                    "serves on. Each update is atomic; they are applied in file order and the new graph version "
                    "is printed after each (pass it to 'gnnserve predict --min-graph-version'). Every update of "
                    "the file is checked before the first is sent; if the server refuses one, the ones after it "
                    "are not sent (exit 2 for INVALID_ARGUMENT, 1 for other errors).",
        epilog="FILE: one JSON object per line, or a JSON array; '-' reads stdin. Example line: "
               '{"features": {"7": [0.1, 0.2]}, "add_edges": [[1, 2], [3, 4, 0.5]], "remove_edges": [[5, 6]], '
               '"new_nodes": [{"features": [0.3, 0.1], "neighbors": [1, 2]}]}',
    )
    ap.add_argument("file", help="update file (JSON lines or a JSON array), '-' for stdin")
    ap.add_argument("--model", required=True, help="any model served on the graph to change")
    _version_arg(ap)
    ap.add_argument("--json", action="store_true", help="print one JSON object per update")
    _connection_args(ap)
    return ap


def _read_input(path: str) -> tuple[str, str]:
    """``(text, where)`` of a file argument ('-': stdin), a usage error naming it when it cannot be read."""
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(path).read_text(), path
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _UsageError(f"cannot read {path!r}: {why}") from None


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _stopped_at(place: str, index: int, total: int, applied_version: int | None, exc: GnnServeError) -> str:
    """What became of a file's updates when update ``index`` (0-based) of ``total`` failed."""
    if index == 0:
        before = "no earlier update was applied"
    else:
        before = f"the {_count(index, 'earlier update')} {'was' if index == 1 else 'were'} applied " \
                 f"(graph version {applied_version})"
    if exc.code.name in _REFUSED:
        this = "this one was not"
    else:  # lost on the way or on the server: the server may have applied it before the failure
        this = "this one may or may not have been applied (see the graph version 'gnnserve models' shows"
        if applied_version is not None:  # what the graph was at after the update before it
            this += f": above {applied_version} if it was, unless another client updated the graph meanwhile"
        this += ")"
    rest = total - index - 1
    after = f"the {_count(rest, 'update')} after it {'was' if rest == 1 else 'were'} not sent" if rest \
        else "it was the last one"
    return f"stopped at {place} (update {index + 1} of {total}): {before}; {this}; {after}"


def _update(args: argparse.Namespace, out: TextIO) -> int:
    prog = "gnnserve update"
    text, where = _read_input(args.file)
    calls = [(place, _update_args(item, place)) for place, item in _parse_updates(text, where)]
    version: int | None = None
    with _client(args) as client:
        for i, (place, kw) in enumerate(calls):
            try:
                res = client.update_graph(args.model, version=args.version, **kw)
            except GnnServeError as exc:
                print(f"{prog}: {place}: {exc.code.name}: {exc.details}", file=sys.stderr)
                if exc.attempts > 1:
                    print(f"{prog}: (gave up after {exc.attempts} attempts)", file=sys.stderr)
                print(f"{prog}: {_stopped_at(place, i, len(calls), version, exc)}", file=sys.stderr)
                return 2 if isinstance(exc, InvalidArgumentError) else 1
            version = res.graph_version
            if args.json:
                json.dump({"graph_version": res.graph_version, "new_node_ids": res.new_node_ids.tolist(),
                           "num_nodes": res.num_nodes, "num_edges": res.num_edges, "request_id": res.request_id,
                           "invalidated": res.invalidated, "apply_ms": round(res.apply_ms, 3)}, out)
                out.write("\n")
            else:
                new = f"  new nodes {res.new_node_ids.tolist()}" if len(res.new_node_ids) else ""
                out.write(f"graph version {res.graph_version}: {res.num_nodes} nodes, {res.num_edges} edges{new}  "
                          f"(applied in {res.apply_ms:.2f} ms)\n")
            out.flush()
    return 0


def update_main(argv: Sequence[str] | None = None) -> int:
    """``gnnserve update``: returns the exit code (0 ok, 2 bad arguments / INVALID_ARGUMENT, 1 other errors).

    Example::

        update_main(["--server", "127.0.0.1:8500", "--model", "cora-gcn", "updates.jsonl"])
    """
    return _run("gnnserve update", _update_parser, argv, _update)


if __name__ == "__main__":  # python -m clients.cli predict|models|update ...
    cmds = {"predict": predict_main, "models": models_main, "update": update_main}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        print("usage: python -m clients.cli {predict,models,update} [options]", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(cmds[sys.argv[1]](sys.argv[2:]))
