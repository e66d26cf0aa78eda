"""Declared sizes of a request, read from its bytes before protobuf parses them.

Parsing a request costs memory in proportion to what it declares, not to its size on the wire: a
packed ``int64`` id takes one byte on the wire and eight in the parsed message (and more as a
NumPy copy), so a 64 MiB message of small ids would cost about 512 MiB and seconds of work before
the node limit could be checked on the parsed message. :func:`check_predict`,
:func:`check_infer` and :func:`check_update` walk the top-level fields of a
``gnnserve.v1.PredictRequest`` / ``inference.ModelInferRequest`` / ``gnnserve.v1.UpdateGraphRequest``
instead, count what they declare (node ids, new nodes, new-node edges, requested outputs; an update's
entries against ``--max-update-size``), and raise :class:`~serve.errors.InvalidArgument` before
anything is allocated. The walk reads every field header once and skips payloads; it stops as soon as a count
passes its limit, and it refuses a message that encodes more fields than any valid request has,
so its own cost is bounded too. Messages shorter than any limit skip it (:meth:`WireLimits.needs_scan`).

Protobuf wire format: each field is a varint key ``(number << 3) | type`` followed by a varint
(type 0), 8 bytes (type 1), a varint length and that many bytes (type 2), or 4 bytes (type 5).
A packed repeated varint field is one type-2 field whose payload is the varints back to back: its
element count is the number of bytes without the continuation bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .errors import InvalidArgument

__all__ = ["WireLimits", "check_infer", "check_predict", "check_update", "update_size_error"]

_HIGH = bytes(range(128, 256))  # bytes with the continuation bit: every varint has exactly one byte without it


@dataclass(frozen=True)
class WireLimits:
    """What a request may declare (server-wide; the per-model checks after parsing still apply)."""

    max_nodes: int = 4096  # ids + new nodes per request
    max_new_node_edges: int = 100_000  # neighbours over all new nodes of one request
    max_outputs: int = 3  # distinct KServe outputs (LABELS, PROBABILITIES, EMBEDDINGS)
    max_parameters: int = 64  # KServe request parameters
    max_features: int = 1 << 16  # features per new node a KServe request may carry (NEW_NODE_FEATURES [m, F])
    max_update_size: int = 100_000  # entries of one UpdateGraph (--max-update-size; serve.live.parse_update)

    def needs_scan(self, size: int) -> bool:
        """Whether a message of ``size`` bytes could declare more than a limit allows (every element
        takes at least one byte)."""
        return size > min(self.max_nodes, self.max_new_node_edges, 1 << 12)

    @property
    def max_fields(self) -> int:
        """Field headers a valid request can hold: one per id and per new-node edge (unpacked
        encoding), a few per new node, plus a margin for scalar fields."""
        return 2 * self.max_nodes + self.max_new_node_edges + 8 * self.max_nodes + 4096

    @property
    def max_update_fields(self) -> int:
        """Field headers the walk of a valid ``UpdateGraphRequest`` reads: one per feature row, new node and edge
        (top level), and in each new node one for its packed features and one per neighbour and per weight
        (unpacked; packed, one each): at most twice the entries, plus a margin for scalar fields."""
        return 2 * self.max_update_size + 4096


class _Walk:
    """Field-by-field reader of one message with a shared budget of field headers."""

    def __init__(self, buf: bytes | memoryview, budget: int) -> None:
        self.buf = memoryview(buf)
        self.budget = budget

    def _varint(self, pos: int, end: int) -> tuple[int, int]:
        buf = self.buf
        value = shift = 0
        while True:
            if pos >= end or shift > 63:
                raise _Malformed
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value, pos
            shift += 7

    def fields(self, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
        """``(number, wire type, payload start, payload end)`` per field; a varint field's payload
        is its encoded bytes."""
        pos = start
        while pos < end:
            self.budget -= 1
            if self.budget < 0:
                raise _TooManyFields
            key, pos = self._varint(pos, end)
            number, wtype = key >> 3, key & 7
            if wtype == 0:
                _, nxt = self._varint(pos, end)
            elif wtype == 1:
                nxt = pos + 8
            elif wtype == 2:
                length, pos = self._varint(pos, end)
                nxt = pos + length
            elif wtype == 5:
                nxt = pos + 4
            else:  # groups (3, 4) are not proto3; anything else is corrupt
                raise _Malformed
            if nxt > end:
                raise _Malformed
            yield number, wtype, pos, nxt
            pos = nxt

    def count(self, wtype: int, start: int, end: int, width: int = 0, cap: int = 1 << 62) -> int:
        """Elements of a repeated scalar field occurrence: packed (type 2) or one element.
        ``width`` 0 = varints, else the fixed size of one element. Past ``cap`` elements the result
        may be a lower bound (a packed varint payload is not read when its length alone exceeds it)."""
        if wtype != 2:
            return 1
        if width:
            return (end - start) // width
        if end - start > 10 * cap:  # at most 10 bytes per varint: more than ``cap`` for sure
            return (end - start + 9) // 10
        # the bytes left once those with the continuation bit are deleted: one per varint
        return len(self.buf[start:end].tobytes().translate(None, _HIGH))


class _Malformed(Exception):
    pass


class _TooManyFields(Exception):
    pass


def _too_many_nodes(n: int, limits: WireLimits) -> InvalidArgument:
    return InvalidArgument(
        f"request has at least {n} nodes, more than the limit of {limits.max_nodes} per request; "
        "split it (the SDK chunks long lists automatically)")


def _walk(check, buf: bytes, limits: WireLimits, budget: int | None = None) -> None:
    """``check`` on the fields of ``buf`` with a budget of field headers (``limits.max_fields`` by default)."""
    if budget is None:
        if not limits.needs_scan(len(buf)):
            return
        budget = limits.max_fields
    try:
        check(_Walk(buf, budget), len(buf), limits)
    except _Malformed:
        return  # protobuf's own parse rejects it with its message (INVALID_ARGUMENT)
    except _TooManyFields:
        raise InvalidArgument(f"request encodes more than {budget} fields, more than any valid "
                              "request of this server's limits") from None


def check_predict(buf: bytes, limits: WireLimits) -> None:
    """Refuse a ``PredictRequest`` that declares more nodes or new-node edges than ``limits`` allow."""
    _walk(_predict, buf, limits)


def _predict(w: _Walk, end: int, limits: WireLimits) -> None:
    nodes = edges = 0
    for number, wtype, s, e in w.fields(0, end):
        if number == 3:  # repeated int64 nodes
            nodes += w.count(wtype, s, e, cap=limits.max_nodes)
        elif number == 10 and wtype == 2:  # repeated NewNode new_nodes
            nodes += 1
            for n2, t2, s2, e2 in w.fields(s, e):
                if n2 == 2:  # repeated int64 neighbors
                    edges += w.count(t2, s2, e2, cap=limits.max_new_node_edges)
            if edges > limits.max_new_node_edges:
                raise InvalidArgument(
                    f"new nodes have at least {edges} neighbours in all, more than the limit of "
                    f"{limits.max_new_node_edges} per request; send fewer or split the request")
        if nodes > limits.max_nodes:
            raise _too_many_nodes(nodes, limits)


def update_size_error(size: int, max_size: int, *, at_least: bool = False) -> InvalidArgument:
    """The refusal of an update of ``size`` entries (:func:`check_update` on the bytes, ``serve.live.parse_update``
    on the parsed request: one message)."""
    return InvalidArgument(f"this update has {'at least ' if at_least else ''}{size} entries (rows, new nodes and "
                           f"their edges, edges), more than --max-update-size {max_size}; split it into several "
                           "updates")


def check_update(buf: bytes, limits: WireLimits) -> None:
    """Refuse an ``UpdateGraphRequest`` that declares more entries than ``limits.max_update_size``: the entries
    ``serve.live.parse_update`` counts (feature rows, new nodes and their neighbours, removed and added edges),
    counted on the bytes (a packed neighbour id is one byte on the wire and eight parsed). A message of at most
    that many bytes cannot hold more (every entry takes a byte at least) and is not read."""
    if len(buf) > limits.max_update_size:
        _walk(_update, buf, limits, budget=limits.max_update_fields)


def _update(w: _Walk, end: int, limits: WireLimits) -> None:
    cap = limits.max_update_size
    size = 0
    for number, wtype, s, e in w.fields(0, end):
        if wtype != 2:  # expect_graph_version, or a field of another wire type than its own (unknown to the parse)
            continue
        if number in (3, 5, 6):  # repeated FeatureRow features, repeated Edge remove_edges / add_edges
            size += 1
        elif number == 4:  # repeated NewNode new_nodes: the node and each of its neighbours
            size += 1
            for n2, t2, s2, e2 in w.fields(s, e):
                if n2 == 2 and t2 in (0, 2):  # repeated int64 neighbors, unpacked or packed
                    size += w.count(t2, s2, e2, cap=cap)
                    if size > cap:
                        break
        if size > cap:
            raise update_size_error(size, cap, at_least=True)


def check_infer(buf: bytes, limits: WireLimits) -> None:
    """Refuse a KServe ``ModelInferRequest`` that declares more input elements than their limits allow (see
    :func:`_infer`), more requested outputs than exist, or more parameters than ``limits.max_parameters``."""
    _walk(_infer, buf, limits)


# InferTensorContents: field number -> element width on the wire when packed (0 = varint)
_CONTENT_WIDTH = {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 4, 7: 8}

#: the KServe / Triton inputs a model takes (serve.triton's INPUT_SPECS gives their types and shapes): existing
#: nodes, and new nodes (not in the graph), all optional: features [m, F], neighbour counts [m], the neighbours
#: flattened [e], their weights [e]. Named here, below serve.triton, for the wire's limits
INPUT = "NODE_IDS"
NEW_FEATURES = "NEW_NODE_FEATURES"
NEW_COUNTS = "NEW_NODE_NEIGHBOR_COUNTS"
NEW_NEIGHBORS = "NEW_NODE_NEIGHBORS"
NEW_WEIGHTS = "NEW_NODE_EDGE_WEIGHTS"

#: KServe input name -> (what its elements count against, bytes per element in raw_input_contents). Any other
#: name (refused after the parse) and a raw entry without an input count as node ids, the strictest limit.
_INPUT_KINDS = {name.encode(): kind for name, kind in (
    (INPUT, ("nodes", 8)),
    (NEW_COUNTS, ("nodes", 8)),  # one count per new node
    (NEW_FEATURES, ("features", 4)),
    (NEW_NEIGHBORS, ("neighbors", 8)),
    (NEW_WEIGHTS, ("weights", 4)),
)}
_OTHER = ("nodes", 8)


def _infer(w: _Walk, end: int, limits: WireLimits) -> None:
    """Each input's elements (in ``contents`` or its ``raw_input_contents`` entry, matched by position) count
    against the limit of its name: ``NODE_IDS`` and ``NEW_NODE_NEIGHBOR_COUNTS`` (one per new node) against
    ``max_nodes``, ``NEW_NODE_NEIGHBORS`` and ``NEW_NODE_EDGE_WEIGHTS`` each against ``max_new_node_edges``,
    ``NEW_NODE_FEATURES`` against ``max_nodes * max_features`` (the message size bounds it first); other
    names against ``max_nodes``. Totals are per kind over every input of that kind (a repeated name adds)."""
    caps = {"nodes": limits.max_nodes, "features": limits.max_nodes * limits.max_features,
            "neighbors": limits.max_new_node_edges, "weights": limits.max_new_node_edges}
    biggest = max(caps.values())
    totals = dict.fromkeys(caps, 0)
    kinds: list[tuple[str, int]] = []  # per input, in order
    raw: list[int] = []  # bytes of each raw_input_contents entry, in order
    outputs = params = 0

    def add(kind: str, n: int) -> None:
        totals[kind] += n
        if totals[kind] > caps[kind]:
            raise _over(kind, totals[kind], limits)

    for number, wtype, s, e in w.fields(0, end):
        if number == 5 and wtype == 2:  # repeated InferInputTensor inputs
            name = b""
            elements = 0
            for n2, t2, s2, e2 in w.fields(s, e):
                if n2 == 1 and t2 == 2:  # string name (the last one wins, as in protobuf's parse)
                    name = w.buf[s2:e2].tobytes() if e2 - s2 <= 64 else b"?"
                elif n2 == 5 and t2 == 2:  # InferTensorContents contents
                    for n3, t3, s3, e3 in w.fields(s2, e2):
                        if n3 in _CONTENT_WIDTH:
                            elements += w.count(t3, s3, e3, _CONTENT_WIDTH[n3], cap=biggest)
                        elif n3 == 8:  # repeated bytes: one element each
                            elements += 1
                        if name:  # its name came first (as protobuf writes it): stop at its own limit
                            kind = _INPUT_KINDS.get(name, _OTHER)[0]
                            if totals[kind] + elements > caps[kind]:
                                raise _over(kind, totals[kind] + elements, limits)
                        elif elements > biggest:
                            raise InvalidArgument(f"an input has at least {elements} values, more than any "
                                                  "input's limit per request")
            kind, width = _INPUT_KINDS.get(name, _OTHER)
            kinds.append((kind, width))
            add(kind, elements)
            if len(raw) >= len(kinds):  # its raw entry came first on the wire
                add(kind, raw[len(kinds) - 1] // width)
        elif number == 7 and wtype == 2:  # repeated bytes raw_input_contents: one entry per input, in order
            raw.append(e - s)
            if len(raw) <= len(kinds):  # its input came first
                kind, width = kinds[len(raw) - 1]
                add(kind, (e - s) // width)
        elif number == 6:
            outputs += 1
            if outputs > limits.max_outputs:
                raise InvalidArgument(f"request asks for more than {limits.max_outputs} outputs; each of "
                                      "LABELS, PROBABILITIES and EMBEDDINGS may be requested once")
        elif number == 4:
            params += 1
            if params > limits.max_parameters:
                raise InvalidArgument(f"request has more than {limits.max_parameters} parameters")
    for size in raw[len(kinds):]:  # entries without an input: as node ids
        add(_OTHER[0], size // _OTHER[1])


def _over(kind: str, n: int, limits: WireLimits) -> InvalidArgument:
    if kind == "nodes":
        return _too_many_nodes(n, limits)
    if kind == "features":
        return InvalidArgument(
            f"input NEW_NODE_FEATURES has at least {n} values, more than the limit of {limits.max_nodes} new nodes "
            f"x {limits.max_features} features per request; send fewer new nodes or split the request")
    name = "NEW_NODE_NEIGHBORS" if kind == "neighbors" else "NEW_NODE_EDGE_WEIGHTS"
    return InvalidArgument(
        f"input {name} has at least {n} values, more than the limit of {limits.max_new_node_edges} new-node "
        "neighbours per request; send fewer or split the request")
