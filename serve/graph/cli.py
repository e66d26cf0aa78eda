"""``gnnserve graph load|verify``: store a graph's adjacency and PPR top-K lists in Redis."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

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
    for name in ("load", "verify"):
        p = sub.add_parser(name)
        p.add_argument("--dataset", required=True, help="dataset (.npz, dataset directory, synthetic:N:seed)")
        p.add_argument("--redis", required=True, help="redis://, rediss://, unix:// or redis+cluster:// URL")
        p.add_argument("--ppr-cache", default=None, help="PPR index directory (default REPO/_ppr with --repo)")
        if name == "load":
            p.add_argument("--version", type=int, default=1)
            p.add_argument("--repo", default=None, help="load PPR lists for every PPR model of this repository")
            p.add_argument("--ppr-k", type=int, default=None, help="also load lists for PPRConfig(topk=K, ...)")
            p.add_argument("--ppr-alpha", type=float, default=None)
            p.add_argument("--ppr-eps", type=float, default=None)
            p.add_argument("--scores", choices=sorted(SCORE_CODES), default="float16")
            p.add_argument("--chunk-size", type=int, default=2048)
            p.add_argument("--no-progress", action="store_true")
        else:
            p.add_argument("--version", type=int, default=None)
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

