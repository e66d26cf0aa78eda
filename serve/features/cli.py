"""``gnnserve features``: load node features into Redis, verify a load, list or delete versions.

    gnnserve features load   --dataset PATH.npz --redis URL [--version V] [--dtype float16] [--verify]
    gnnserve features verify --dataset PATH.npz --redis URL [--version V]
    gnnserve features list   --dataset PATH.npz --redis URL
    gnnserve features delete --dataset PATH.npz --redis URL --version V

A load is chunked, pipelined, resumable (run the same command again after an interruption) and
verified (count + checksum) before the version goes live; ``load --verify`` only checks an
existing load (the form the issue names), like ``verify``. Passwords in URLs never reach the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence

from ..cli import DATASET_HELP

__all__ = ["main"]



def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gnnserve features", description="Manage node features in Redis.")
    sub = ap.add_subparsers(dest="action", required=True)

    def common(p: argparse.ArgumentParser, json_help: str = "print the report as JSON") -> None:
        p.add_argument("--dataset", required=True, help=DATASET_HELP)
        p.add_argument("--redis", required=True, help="redis://, rediss://, unix:// or redis+cluster:// URL")
        p.add_argument("--json", action="store_true", help=json_help)

    p = sub.add_parser("load", help="write features (resumable, verified before going live)")
    common(p)
    p.add_argument("--version", type=int, default=1,
                   help="feature version to write (or, with --verify, to check; default: %(default)s)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                   help="how the features are stored (float16: half the memory, rounded; default: %(default)s)")
    p.add_argument("--chunk-size", type=int, default=4096,
                   help="nodes per chunk: one pipelined write and read-back each, and the unit of resuming "
                        "(a resumed load keeps the size it started with; default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="restart an interrupted load that holds other features")
    p.add_argument("--verify", action="store_true", help="only verify an existing load (write nothing)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p = sub.add_parser("verify", help="check an existing load against the dataset")
    common(p)
    p.add_argument("--version", type=int, default=None, help="feature version to check (default: the current version)")
    p = sub.add_parser("list", help="versions stored for this dataset's graph")
    common(p, "print the versions as a JSON list")
    p = sub.add_parser("delete", help="delete one version")
    common(p, "no effect here: delete prints one line either way")
    p.add_argument("--version", type=int, required=True, help="feature version to delete")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from kernels.datasets import DatasetError, load_dataset

    from . import FeatureStoreError, delete_features, list_versions, load_features, verify_features

    try:
        ds = load_dataset(args.dataset)
    except (DatasetError, OSError, ValueError) as exc:
        print(f"error: cannot load dataset {args.dataset}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.action == "load" and not args.verify:
            report = load_features(
                ds, args.redis, version=args.version, chunk_size=args.chunk_size, dtype=args.dtype,
                overwrite=args.overwrite, progress=not args.no_progress,
            )
            ok = report.complete and (report.verify is None or report.verify.ok)
        elif args.action in ("load", "verify"):
            report = verify_features(args.redis, dataset=ds, version=args.version)
            ok = report.ok
        elif args.action == "list":
            versions = list_versions(args.redis, ds.graph.fingerprint())
            if args.json:
                print(json.dumps(versions, indent=2))
            else:
                if not versions:
                    print(f"no feature versions for graph {ds.graph.fingerprint()}")
                for v in versions:
                    print(f"v{v.get('version')}: state={v.get('state')} current={v.get('current')} "
                          f"nodes={v.get('num_nodes')} features={v.get('num_features')} dtype={v.get('dtype')}")
            return 0
        else:
            removed = delete_features(args.redis, ds.graph.fingerprint(), args.version)
            print(f"deleted {removed} keys of version {args.version}")
            return 0
    except FeatureStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(dataclasses.asdict(report), indent=2, default=str) if args.json else report.summary())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
