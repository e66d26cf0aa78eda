"""``gnnserve graph load|verify``: store a graph's adjacency and PPR top-K lists in Redis."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from ..cli import DATASET_HELP
from ..features.base import FeatureCorrupt, FeatureNotFound, FeatureUnavailable
from .loader import load_graph, verify_graph
from .schema import SCORE_CODES

__all__ = ["main"]



def _repo_ppr_configs(repo: str, dataset_fp: str) -> list[Any]:
    """PPR configurations of the repository's checkpoints trained on this dataset (config.json only)."""
    from pathlib import Path

    from kernels.ppr import PPRConfig

    out: dict[str, Any] = {}
    for cfg_path in sorted(Path(repo).glob("*/*/config.json")):
        if cfg_path.parent.parent.name.startswith(("_", ".")):
            continue
        try:
            conf = json.loads(cfg_path.read_text())
        except (OSError, ValueError):
            continue
        if conf.get("ppr") and conf.get("dataset", {}).get("fingerprint") == dataset_fp:
            c = PPRConfig.from_dict(conf["ppr"])
            out[c.key()] = c
    return list(out.values())


def main(argv: Sequence[str] | None = None) -> int:
    """``gnnserve graph load|verify``."""
    ap = argparse.ArgumentParser(prog="gnnserve graph",
                                 description="Store a graph's adjacency and PPR top-K lists in Redis (stateless replicas).")
    sub = ap.add_subparsers(dest="action", required=True)
    texts = {"load": "write the dataset's adjacency rows (and PPR top-K lists) to Redis as a new graph version, "
                     "verified before it goes live",
             "verify": "compare a stored graph version (and its PPR lists) with the dataset, row for row"}
    for name in ("load", "verify"):
        p = sub.add_parser(name, help=texts[name], description=texts[name])
        p.add_argument("--dataset", required=True, help=DATASET_HELP)
        p.add_argument("--redis", required=True, help="redis://, rediss://, unix:// or redis+cluster:// URL")
        if name == "load":
            p.add_argument("--ppr-cache", default=None,
                           help="directory of PPR index files to open, or build the indexes into (default: "
                                "REPO/_ppr with --repo, else built in memory)")
            p.add_argument("--version", type=int, default=1,
                           help="graph version to write (a live version is never overwritten: load a new one; "
                                "default: %(default)s)")
            p.add_argument("--repo", default=None,
                           help="load PPR lists for every PPR (shaDow) model of this repository trained on the "
                                "dataset")
            p.add_argument("--ppr-k", type=int, default=None,
                           help="also load lists for PPRConfig(topk=K, alpha=--ppr-alpha, eps=--ppr-eps)")
            p.add_argument("--ppr-alpha", type=float, default=None,
                           help="with --ppr-k: PPR teleport probability (default: PPRConfig's, 0.15)")
            p.add_argument("--ppr-eps", type=float, default=None,
                           help="with --ppr-k: PPR push tolerance (default: PPRConfig's, 1e-05)")
            p.add_argument("--scores", choices=sorted(SCORE_CODES), default="float16",
                           help="store the PPR scores too, at this precision ('none': lists only; serving does "
                                "not need them; default: %(default)s)")
            p.add_argument("--chunk-size", type=int, default=2048,
                           help="consecutive nodes per pipelined write and read-back check (default: %(default)s)")
            p.add_argument("--no-progress", action="store_true", help="no progress bars")
        else:
            p.add_argument("--ppr-cache", default=None,
                           help="directory of PPR index files (e.g. REPO/_ppr) to open, or build the indexes "
                                "into, for comparing the stored lists (default: built in memory)")
            p.add_argument("--version", type=int, default=None,
                           help="graph version to check (default: the current one)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from kernels.datasets import load_dataset
    from kernels.ppr import PPRConfig

    try:
        ds = load_dataset(args.dataset)
    except (OSError, ValueError) as exc:
        print(f"error: cannot load dataset {args.dataset}: {exc}", file=sys.stderr)
        return 2
    cache = args.ppr_cache or (f"{args.repo}/_ppr" if getattr(args, "repo", None) else None)
    try:
        if args.action == "verify":
            ok, msg = verify_graph(ds, args.redis, version=args.version, ppr_cache_dir=cache)
            print(msg)
            return 0 if ok else 1
        cfgs = _repo_ppr_configs(args.repo, ds.fingerprint()) if args.repo else []
        if args.ppr_k is not None:
            kw: dict[str, Any] = {"topk": args.ppr_k}
            if args.ppr_alpha is not None:
                kw["alpha"] = args.ppr_alpha
            if args.ppr_eps is not None:
                kw["eps"] = args.ppr_eps
            cfgs.append(PPRConfig(**kw))
        report = load_graph(ds, args.redis, version=args.version, ppr=cfgs, ppr_cache_dir=cache,
                            scores=args.scores, chunk_size=args.chunk_size, progress=not args.no_progress)
    except (FeatureUnavailable, FeatureCorrupt, FeatureNotFound, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

