"""The compiled forward (kernels.fused_forward) against the torch path, through ``ModelRuntime.process``.

Loads a model repository the way the server does (``GnnServer``, projections warmed, no gRPC) and
times ``process`` on batches of ``B`` random distinct targets, once with the compiled forward
(``plain-compiled`` / ``plain-activations`` / ``shadow-compiled`` of ``serve.paths``) and once with
the torch path (``plain-torch`` / ``subgraph-torch``), in alternating rounds; per model, at its
default setting and at exact width with its largest PPR budget. Reported: the best round's mean time
per batch and the ratio torch / compiled. This is what ``RuntimeOptions.fused_max_targets``
(``serve.runtime.FUSED_MAX_TARGETS``) is chosen from. A plain 2-layer model's compiled path runs the last layer
alone from its activation cache (``serve.projection.ActivationCache``, filled for the width first:
steady state); it is also timed without the cache (``whole plan``: both layers compiled), and the
column after is whole plan / cached. ``served``: ``process`` choosing the path itself, as the server does (a
shaDow batch of more than ``serve.runtime.COMPILED_CHUNK_TARGETS`` targets in chunks; otherwise the compiled
path).

    python benchmarks/serve.py --datasets amazon_computers --models gcn,shadow-gcn --cache-dir DIR --train-only
    python benchmarks/fused.py --repo DIR/amazon_computers/repo --models gcn,shadow-gcn

``--base REV``: also the compiled path with ``kernels/fused_forward.py`` as it was at git revision ``REV``
(``at_revision.kernels_module_at``, beside this tree's; ``serve.paths`` calls it for that variant), in
the same rounds: the A/B of a change to the compiled forwards, without gRPC. The base's functions get
this tree's ``StackParams``, so ``REV`` must take the same parameters.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "benchmarks"))  # at_revision, also when loaded as a module (after REPO: serve.py)

from at_revision import kernels_module_at  # noqa: E402

_SWAPPED = ("plan_forward_cpu", "plan_outer_cpu", "shadow_forward_cpu")


@contextlib.contextmanager
def calling(module: Any) -> Iterator[None]:
    """``serve.paths`` calls ``module``'s compiled forwards inside the block."""
    import serve.paths as paths

    saved = {name: getattr(paths, name) for name in _SWAPPED}
    try:
        for name in _SWAPPED:
            setattr(paths, name, getattr(module, name))
        yield
    finally:
        for name, fn in saved.items():
            setattr(paths, name, fn)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, help="a model repository (checkpoint directories)")
    ap.add_argument("--models", required=True, help="comma-separated model names in the repository")
    ap.add_argument("--batches", default="1,8,16,32,64,128", help="targets per batch")
    ap.add_argument("--sets", type=int, default=40, help="batches per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", default=None, help="git revision: also time its kernels/fused_forward.py (docstring)")
    args = ap.parse_args(argv)

    import numpy as np

    from serve.batcher import WorkItem
    from serve.runtime import PredictCall, RuntimeOptions, _WarmupFuture
    from serve.server import GnnServer, ServerConfig

    workdir = tempfile.TemporaryDirectory() if args.base else None
    base = kernels_module_at(args.base, "fused_forward", Path(workdir.name)) if workdir else None  # before any start
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # grpc.aio binds the server to the current loop
    srv = GnnServer(ServerConfig(repo=args.repo, port=0, poll_s=0, runtime=RuntimeOptions(warm_projections=True)))
    loop.run_until_complete(srv.start())

    sizes = [int(b) for b in args.batches.split(",") if b]
    rng = np.random.default_rng(0)
    print("## Compiled forward against the torch path (`benchmarks/fused.py`)\n")
    print(f"`python benchmarks/fused.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    print(f"{datetime.date.today()}, {platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs; "
          f"ms per `ModelRuntime.process` call, best of {args.rounds} alternating rounds of {args.sets} batches\n")
    at_base = f" | compiled at {args.base} ms | base / compiled" if base is not None else ""
    print(f"| model | S | K | targets | compiled ms | torch ms | torch / compiled | whole plan ms | whole plan / cached"
          f" | served ms | torch / served{at_base} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if base is not None else ""))
    try:
        for model in args.models.split(","):
            rt = srv.registry.get(model, "")
            settings = {(rt.limits.default_sampling_width, rt.limits.default_ppr_budget), (0, rt.limits.max_ppr_budget)}
            by_name = {p.name: p for p in rt.paths}
            plain = rt.extractor == "lhop"
            acts = by_name.get("plain-activations")
            variants = [("compiled", acts or by_name["plain-compiled" if plain else "shadow-compiled"]),
                        ("served", None),  # the runtime's own choice: a large shaDow batch in chunks
                        ("torch", by_name["plain-torch" if plain else "subgraph-torch"])]
            if acts is not None:
                variants.append(("plan", by_name["plain-compiled"]))
            if base is not None:
                variants.append(("base", variants[0][1]))
            for width, budget in sorted(settings, reverse=True):
                if acts is not None:
                    rt._activations.warm(width)
                for b in sizes:
                    if b > rt.graph.num_nodes:
                        continue
                    sets = [rng.choice(rt.graph.num_nodes, b, replace=False).astype(np.int64) for _ in range(args.sets)]
                    best = {name: float("inf") for name, _ in variants}

                    def run(name: str, path: Any, batches: list, width: int = width, budget: int = budget,
                            b: int = b, rt: Any = rt) -> float:
                        with calling(base) if name == "base" else contextlib.nullcontext():
                            t0 = time.perf_counter()
                            for s in batches:
                                call = PredictCall("bench", s, [], width, budget, "default", 0.0, True, False)
                                item = WorkItem(call, b, None, None, time.monotonic(), _WarmupFuture())
                                out = rt.process([item], path=path)[0]
                                if isinstance(out, BaseException):
                                    raise out
                            return 1e3 * (time.perf_counter() - t0) / len(batches)

                    for name, path in variants:  # untimed: a first call compiles (the base's numba cache is empty)
                        run(name, path, sets[:1])
                    for _ in range(args.rounds):
                        for name, path in variants:
                            best[name] = min(best[name], run(name, path, sets))
                    plan = (f"{best['plan']:.3f} | {best['plan'] / best['compiled']:.2f}" if acts is not None
                            else "- | -")
                    vs_base = (f" | {best['base']:.3f} | {best['base'] / best['compiled']:.2f}" if base is not None
                               else "")
                    print(f"| {model} | {width or 'exact'} | {budget or '-'} | {b} | {best['compiled']:.3f} | "
                          f"{best['torch']:.3f} | {best['torch'] / best['compiled']:.2f} | {plan} | {best['served']:.3f} | "
                          f"{best['torch'] / best['served']:.2f}{vs_base} |", flush=True)
    finally:
        loop.run_until_complete(srv.stop())
        if workdir is not None:
            workdir.cleanup()
        loop.close()
        asyncio.set_event_loop(None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
