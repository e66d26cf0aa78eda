"""Versioned data in Redis: the key schema, which version to open, its metadata, and pinning it.

Key schema
----------
Every kind of data (:class:`DataKind`: features, graph) lives under ``<prefix>:<fp>`` where
``<fp>`` is the graph's fingerprint (``CSRGraph.fingerprint()``: identifies the node id space), and
one integer version ``v<V>`` below it, so two graphs or two versions of one graph never mix::

    <prefix>:<fp>:v<V>:{<node mod S>}:[<part>:]<node>  one node's blob of one part (a string)
    <prefix>:<fp>:v<V>:meta                            hash: the version's metadata
    <prefix>:<fp>:current                              string: the newest live version
    <prefix>:<fp>:versions                             set: every version ever started

``{<node mod S>}`` is the Redis Cluster hash tag, ``S`` = ``shards`` (default 256, recorded in the
metadata): the blobs of one node, of every kind, live in one slot (see
:mod:`serve.features.redis_store` for why ``S`` tags). The metadata's ``state`` is ``loading``
until the loader verified every blob (:mod:`serve.redisdata.load`), then ``live``; only a live
version is opened. Its ``checksum`` (the load's digest) pins it: :class:`VersionPin`.

Which version a server opens: an explicit number, else the newest live version loaded from the
model's dataset (``dataset_fingerprint``), not blindly the ``current`` pointer, which may name
another dataset's data (:meth:`VersionKeys.resolve_version`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..features.base import DataVersionChanged
from .connection import RedisTarget
from .errors import FEATURE_ERRORS, ErrorFamily, redis_errors

__all__ = [
    "DEFAULT_SHARDS",
    "DIGEST_UNREACHABLE",
    "DataKind",
    "NodeKeys",
    "PinnedVersion",
    "VersionKeys",
    "VersionPin",
    "check_live",
    "decode_str",
    "read_meta",
]

log = logging.getLogger(__name__)

DEFAULT_SHARDS = 256
_FP_RE = re.compile(r"^[0-9A-Za-z_.-]{1,128}$")


def decode_str(v: Any) -> str:
    """A Redis reply (bytes or not) as ``str``."""
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class DataKind:
    """One kind of versioned data in Redis: its key prefix, its errors and how messages name it.

    Attributes:
        label: ``features`` / ``graph``: pins and data versions (``<label>:v<N>:<digest>``).
        noun: ``feature`` / ``graph``: in messages (``no live feature version``).
        data: ``features`` / ``graph data``: what a version holds, in messages.
        prefix: the key prefix (``gnnserve:feat`` / ``gnnserve:graph``).
        cli: the command that loads and verifies it (``gnnserve features`` / ``gnnserve graph``).
        errors: the error classes raised for it.
    """

    label: str
    noun: str
    data: str
    prefix: str
    cli: str
    errors: ErrorFamily


class NodeKeys:
    """Node keys of one part of a version: ``<base>:{<node mod S>}:[<part>:]<node>`` (bytes)."""

    def __init__(self, base: str, shards: int, part: str = "") -> None:
        self.shards = shards
        sep = f"{part}:" if part else ""
        self._prefix = [f"{base}:{{{s}}}:{sep}".encode() for s in range(shards)]

    def node_key(self, node: int) -> bytes:
        node = int(node)
        return self._prefix[node % self.shards] + str(node).encode()

    def node_keys(self, ids: np.ndarray | Sequence[int]) -> list[bytes]:
        """Keys of ``ids`` in order (bytes; built without per-key formatting beyond the id)."""
        pf, s = self._prefix, self.shards
        lst = ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]
        return [pf[i % s] + b"%d" % i for i in lst]


class VersionKeys:
    """Key names of one version of one :class:`DataKind` (subclasses set :attr:`kind`)."""

    kind: ClassVar[DataKind]
    #: what follows ``{<node mod S>}:`` in :attr:`key_format` (recorded in the metadata)
    node_format: ClassVar[str] = "<node>"

    def __init__(self, fingerprint: str, version: int, shards: int = DEFAULT_SHARDS) -> None:
        if not isinstance(fingerprint, str) or not _FP_RE.match(fingerprint):
            raise ValueError(f"fingerprint must be 1-128 characters of [0-9A-Za-z_.-], got {fingerprint!r}")
        version = int(version)
        if version < 1:
            raise ValueError(f"{self.kind.noun} versions are positive integers, got {version}")
        if not 1 <= int(shards) <= 16384:
            raise ValueError(f"shards must lie in [1, 16384], got {shards}")
        self.fingerprint = fingerprint
        self.version = version
        self.shards = int(shards)
        self.graph_prefix = f"{self.kind.prefix}:{fingerprint}"
        self.base = f"{self.graph_prefix}:v{version}"
        self.meta = f"{self.base}:meta"
        self.current = f"{self.graph_prefix}:current"
        self.versions = f"{self.graph_prefix}:versions"

    def nodes(self, part: str = "") -> NodeKeys:
        """The node keys of one part of this version (``""``: keys without a part name)."""
        return NodeKeys(self.base, self.shards, part)

    @property
    def key_format(self) -> str:
        return f"{self.base}:{{<node mod {self.shards}>}}:{self.node_format}"

    def where(self, target: RedisTarget) -> str:
        """``graph <fp> v<V> at <masked url>``: how messages name this version."""
        return f"graph {self.fingerprint} v{self.version} at {target.masked}"

    @classmethod
    def resolve_version(cls, client: Any, target: RedisTarget, fingerprint: str,
                        dataset_fingerprint: str | None = None) -> int:
        """The version to open when none is given: the ``current`` pointer, or with
        ``dataset_fingerprint`` the newest live version loaded from that dataset (a warning names
        ``current`` when it holds another dataset's data).

        Raises:
            the kind's ``not_found`` error: no live version (matching) exists.
        """
        kind = cls.kind
        keys = cls(fingerprint, 1)
        with redis_errors(target, f"resolving the {kind.noun} version", kind.errors):
            cur = client.get(keys.current)
            if dataset_fingerprint is None:
                if cur is None:
                    raise kind.errors.not_found(f"no live {kind.noun} version for graph {fingerprint} at "
                                                f"{target.masked}: load one with `{kind.cli} load`")
                return int(cur)
            for v in sorted((int(x) for x in client.smembers(keys.versions)), reverse=True):
                m = {decode_str(k): decode_str(x) for k, x in client.hgetall(cls(fingerprint, v).meta).items()}
                if m.get("state") == "live" and m.get("dataset_fingerprint") == dataset_fingerprint:
                    if cur is not None and int(cur) != v:
                        log.warning("%s of graph %s: the current version v%s was not loaded from dataset %s (the "
                                    "model's); using v%d, the newest live version that was", kind.label,
                                    fingerprint, decode_str(cur), dataset_fingerprint, v)
                    return v
        raise kind.errors.not_found(f"no live {kind.noun} version of graph {fingerprint} at {target.masked} holds "
                                    f"dataset {dataset_fingerprint} (the model's): load it with `{kind.cli} load`")


def read_meta(client: Any, target: RedisTarget, keys: VersionKeys) -> dict[str, str]:
    """The metadata hash of a version as ``str -> str`` (empty dict when absent)."""
    with redis_errors(target, f"reading {keys.kind.noun} metadata", keys.kind.errors):
        raw = client.hgetall(keys.meta)
    return {decode_str(k): decode_str(v) for k, v in raw.items()}


def check_live(meta: dict[str, str], keys: VersionKeys, target: RedisTarget, *, fmt: str,
               expect_dataset_fingerprint: str | None = None) -> None:
    """Refuse metadata that is not that of a live version of format ``fmt`` (and of that dataset).

    Raises:
        the kind's ``not_found`` error: no metadata, not live, or loaded from another dataset;
        the kind's ``corrupt`` error: another format.
    """
    kind = keys.kind
    where = keys.where(target)
    if not meta:
        raise kind.errors.not_found(f"no {kind.data} for {where}: load them with `{kind.cli} load`")
    if meta.get("format") != fmt:
        raise kind.errors.corrupt(f"{kind.noun} metadata of {where} has format {meta.get('format')!r}, "
                                  f"expected {fmt!r}")
    if meta.get("state") != "live":
        raise kind.errors.not_found(f"the {kind.data} of {where} are not live (state {meta.get('state')!r}): the "
                                    f"load was interrupted or has not been verified; rerun `{kind.cli} load`")
    if expect_dataset_fingerprint is not None and meta.get("dataset_fingerprint") != expect_dataset_fingerprint:
        raise kind.errors.not_found(f"the {kind.data} of {where} come from dataset "
                                    f"{meta.get('dataset_fingerprint')}, the model was trained on "
                                    f"{expect_dataset_fingerprint}")


#: the digest :func:`serve.redisdata.bulk.fetch_blobs_checked` reports when the metadata's cluster
#: master is unreachable
DIGEST_UNREACHABLE = "\x00unreachable"


class VersionPin:
    """A data version pinned by number *and* content digest (the load's ``checksum``).

    The stores check the digest stored under the pinned number on every fetch from Redis
    (:meth:`check`, on the digest :func:`fetch_blobs_checked` read in the same round trip) and,
    with ``interval > 0``, every ``interval`` seconds from a daemon thread (:meth:`poll`), so a
    version deleted and re-loaded with other content under the same number is noticed even
    when every row a request needs is cached. Once noticed, :attr:`error` holds the
    :class:`DataVersionChanged` to raise (it clears if the pinned content comes back).
    """

    def __init__(self, client: Any, target: RedisTarget, meta_key: str, *, kind: str, version: int,
                 digest: str, interval: float = 0.0, errors: ErrorFamily = FEATURE_ERRORS) -> None:
        self.client, self.target, self.meta_key = client, target, meta_key
        self.kind, self.version, self.digest = kind, int(version), digest
        self.errors = errors
        self.error: DataVersionChanged | None = None
        self.checks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if interval > 0:
            self._thread = threading.Thread(target=self._watch, args=(float(interval),),
                                            name=f"gnnserve-pin-{kind}-v{version}", daemon=True)
            self._thread.start()

    @classmethod
    def open(cls, client: Any, target: RedisTarget, keys: VersionKeys, meta: dict[str, str], *,
             interval: float = 0.0) -> VersionPin:
        """Pin the live version ``keys`` names on the ``checksum`` of its metadata ``meta``.

        Raises:
            the kind's ``corrupt`` error: the version is live but carries no checksum.
        """
        kind = keys.kind
        digest = meta.get("checksum", "")
        if not digest:
            raise kind.errors.corrupt(f"the {kind.data} of {keys.where(target)} are live but carry no checksum: "
                                      f"verify them with `{kind.cli} verify`")
        return cls(client, target, keys.meta, kind=kind.label, version=keys.version, digest=digest,
                   interval=interval, errors=kind.errors)

    @property
    def label(self) -> str:
        """``"<kind>:v<version>:<digest>"``: what a response echoes as its data version."""
        return f"{self.kind}:v{self.version}:{self.digest}"

    def check(self, found: str | None) -> None:
        """Raise :class:`DataVersionChanged` unless ``found`` (the stored digest) is the pinned one.

        ``None`` (no metadata: the version was deleted, or Redis lost its data) passes: a load
        creates the metadata (digest ``""``) before it writes any row, so without metadata no row
        of other content can have been written; missing rows then raise ``FeatureNotFound`` as
        usual, and the same content loaded again (same digest) is served again.
        """
        self.checks += 1
        if found == DIGEST_UNREACHABLE:
            self.raise_if_changed()
            return
        if found is None or found == self.digest:
            self.error = None
            return
        what = "is being re-loaded (state loading)" if found == "" else f"now holds other content (digest {found})"
        err = DataVersionChanged(
            f"{self.kind} version {self.version} pinned at open time with digest {self.digest} {what} at "
            f"{self.target.masked}: refusing to mix data versions; reload the model (or restart the server) to "
            "pick up the data now in Redis", kind=self.kind, version=self.version, pinned=self.digest,
            found=found or "")
        if self.error is None:
            log.error("%s", err)
        self.error = err
        raise err

    def poll(self) -> None:
        """Read the stored digest now and :meth:`check` it (Redis errors propagate as store errors)."""
        with redis_errors(self.target, f"checking the pinned {self.kind} version", self.errors):
            ck = self.client.hget(self.meta_key, "checksum")
        self.check(None if ck is None else decode_str(ck))

    def raise_if_changed(self) -> None:
        """Raise the last :class:`DataVersionChanged` seen, without any I/O."""
        if self.error is not None:
            raise self.error

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.poll()
            except DataVersionChanged:
                continue
            except Exception as exc:  # Redis down: the next fetch reports it; keep watching
                log.debug("pinned %s version check failed: %s", self.kind, exc)

    def stop(self) -> None:
        self._stop.set()


class PinnedVersion:
    """What a store reading one pinned version exposes (mixed into the feature and graph stores,
    which set ``_pin`` to their :class:`VersionPin` once open)."""

    _pin: VersionPin | None

    @property
    def digest(self) -> str:
        """The content digest (the load's ``checksum``) this store pinned at open time."""
        return self._pin.digest if self._pin is not None else ""

    @property
    def data_version(self) -> str:
        """``<kind>:v<version>:<checksum>`` (``features:...``, ``graph:...``); raises
        :class:`DataVersionChanged` once a check saw the pinned version deleted or replaced."""
        assert self._pin is not None
        self._pin.raise_if_changed()
        return self._pin.label

    def check_version(self) -> None:
        """Read the stored digest now; raises :class:`DataVersionChanged` if it is not the pinned one."""
        assert self._pin is not None
        self._pin.poll()
