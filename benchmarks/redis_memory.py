"""Redis memory per stored row, with gnnserve's own key names (docs/SCALING.md "Memory per key").

For each value size, ``--keys`` node keys of a feature version and of a graph version's adjacency
part (``serve.features.redis_store.FeatureKeys`` / ``serve.graph.schema.GraphKeys``: the names
gnnserve writes, about 65 characters with a 32-character fingerprint) are written with
pipelined ``SET`` s of random payloads into a private ``redis-server`` (the one the tests use),
and the ``INFO memory`` ``used_memory`` delta is divided by the key count. Bytes per key depend on
the Redis version and its allocator, not on the CPU; the script prints the server's version.

    python benchmarks/redis_memory.py                       # sizes 132 .. 1216 bytes, 50,000 keys each
    python benchmarks/redis_memory.py --sizes 264,520 --keys 20000 --json out.json

Prints a Markdown table: value bytes, memory per key, overhead per key (memory minus payload).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.redis_server import RedisServer  # noqa: E402

FINGERPRINT = "f" * 32  # a dataset fingerprint's length (16 bytes of BLAKE2b, hex)


def measure(client: object, keys: list[bytes], size: int, rng: np.random.Generator, batch: int = 2000) -> float:
    """Bytes of ``used_memory`` per key after writing ``keys`` with ``size``-byte values (then deleted)."""
    client.flushall()  # type: ignore[attr-defined]
    before = int(client.info("memory")["used_memory"])  # type: ignore[attr-defined]
    for start in range(0, len(keys), batch):
        pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
        chunk = keys[start:start + batch]
        payload = rng.integers(0, 256, size=(len(chunk), size), dtype=np.uint8)
        for k, row in zip(chunk, payload, strict=True):
            pipe.set(k, row.tobytes())
        pipe.execute()
    after = int(client.info("memory")["used_memory"])  # type: ignore[attr-defined]
    client.flushall()  # type: ignore[attr-defined]
    return (after - before) / len(keys)


def main(argv: list[str] | None = None) -> int:
    from serve.features.redis_store import FeatureKeys
    from serve.graph.schema import GraphKeys

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="132,264,400,520,816,1216", help="value sizes in bytes")
    ap.add_argument("--keys", type=int, default=50_000, help="keys per size and key kind")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    ids = np.arange(10_000_000, 10_000_000 + args.keys)  # 8-digit ids, as in a graph of 10 M+ nodes
    kinds = {"feature": FeatureKeys(FINGERPRINT, 1).node_keys(ids), "adjacency": GraphKeys(FINGERPRINT, 1).adj.node_keys(ids)}
    rng = np.random.default_rng(0)
    rows = []
    with RedisServer() as rs:
        c = rs.client()
        info = c.info("server")
        for size in sizes:
            for kind, keys in kinds.items():
                per_key = measure(c, keys, size, rng)
                rows.append({"kind": kind, "value_bytes": size, "key_bytes": round(float(np.mean([len(k) for k in keys])), 1),
                             "per_key": per_key, "overhead": per_key - size})
        allocator = c.info("memory").get("mem_allocator", "?")
        c.close()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"Redis {info.get('redis_version')} ({allocator}), {date}, {os.cpu_count()} CPUs; {args.keys:,} keys "
          f"per point, pipelined SETs; memory = used_memory delta / keys\n")
    print("| key kind | key bytes | value bytes | memory per key | overhead |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kind']} | {r['key_bytes']:.0f} | {r['value_bytes']} | {r['per_key']:.0f} | {r['overhead']:.0f} |")
    if args.json:
        args.json.write_text(json.dumps({"redis_version": info.get("redis_version"), "allocator": allocator,
                                         "date": date, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
