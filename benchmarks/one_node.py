"""Where a small batch's time goes, CPU against GPU (issue 22: "a one-node GCN request on the GPU at or
below its CPU cost").

Loads a model repository the way the server does (one ``BackgroundServer`` per variant, no gRPC on the
timed path) and times ``ModelRuntime.process`` on batches of ``B`` random targets, split into the stages
it goes through, each measured on the host with ``perf_counter_ns`` by wrapping the function that does it
(this script's wrappers only; the server has none):

* ``process``: the whole call; ``path.run``: the serving path's own work (the rest of ``process`` is
  choosing the path, pricing, building the results);
* on the resident paths: ``captured.answer`` / ``resident.answer`` (the device part), within it
  ``stage_ids`` (the ids into the pinned buffer), ``CUDAGraph.replay``, ``fetch`` (the packed copy back
  and the event wait) and ``unpack_host`` (the rest of ``path.run`` there is mostly the batch's exact
  edge count, on the host);
* on the compiled CPU paths: ``path.run`` is the compiled forward.

Each stage is given in microseconds per batch (its summed time over the timed batches, divided by their
count), the variants interleaved round by round, median over rounds. With ``--profile`` and a GPU, one
``torch.profiler`` pass over one-target batches of the GPU variant prints the operators by host time and
the device time of the replayed graph.

    python benchmarks/one_node.py --repo DIR/amazon_computers/repo --data ../shared/data/amazon_computers.npz \
        --models gcn,shadow-gcn --batches 1,8,64 --profile

* with the fused last layer (``kernels.resident_head``): ``head.launch`` (the kernel's launch) and
  ``head.sync`` (the wait for it; its answers are then in mapped host memory).

Variants: ``cpu`` (``--device cpu``), ``gpu`` (``--device cuda --gpu-min-targets 0``: resident, a plain
model's last layer in one kernel, a shaDow model's batch in one launch (``kernels.shadow_block``, timed by
the same ``head.launch`` / ``head.sync`` stages), every batch on the GPU), ``gpu-graphs`` (the same with
``--no-fused-head --no-fused-shadow``: the torch operators in CUDA graphs); and, not by default,
``gpu-no-graphs`` (``--no-fused-head --no-fused-shadow --no-cuda-graphs``), ``gpu-fused-shadow``
(``--fused-shadow``: the kernel required, the model fails to load without it) and ``cpu-resident``
(``--resident`` on the CPU).
The GPU variants are left out where torch sees no GPU.
"""

from __future__ import annotations

import collections
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "benchmarks"))  # bench_runtime, also when loaded as a module (after REPO: serve.py)

import bench_runtime  # noqa: E402

VARIANTS = {"cpu": {"device": "cpu"}, "cpu-resident": {"device": "cpu", "resident": True},
            "gpu": {"device": "cuda", "gpu_min_targets": 0},
            "gpu-graphs": {"device": "cuda", "gpu_min_targets": 0, "fused_head": False, "fused_shadow": False},
            "gpu-no-graphs": {"device": "cuda", "gpu_min_targets": 0, "cuda_graphs": False, "fused_head": False,
                              "fused_shadow": False},
            "gpu-fused-shadow": {"device": "cuda", "gpu_min_targets": 0, "fused_shadow": True}}
STAGES = ("process", "path.run", "captured.answer", "resident.answer", "stage_ids", "CUDAGraph.replay", "fetch",
          "head.launch", "head.sync", "unpack_host")


class Stages:
    """Host time per stage (ns, summed), by wrapping the callables that do them."""

    def __init__(self) -> None:
        self.ns: collections.Counter[str] = collections.Counter()
        self.undo: list[tuple[Any, str, Any]] = []

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        if obj is None or not hasattr(obj, attr):
            return
        real = getattr(obj, attr)
        ns = self.ns

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter_ns()
            try:
                return real(*a, **k)
            finally:
                ns[name] += time.perf_counter_ns() - t

        self.undo.append((obj, attr, obj.__dict__.get(attr, _MISSING) if hasattr(obj, "__dict__") else _MISSING))
        setattr(obj, attr, timed)

    def restore(self) -> None:
        for obj, attr, old in reversed(self.undo):
            if old is _MISSING:
                delattr(obj, attr)
            else:
                setattr(obj, attr, old)
        self.undo.clear()


_MISSING = object()


def instrument(rt: Any, stages: Stages) -> None:
    stages.wrap(rt, "process", "process")
    for p in rt.paths:
        stages.wrap(p, "run", "path.run")
    for res in (rt._resident, rt._resident_shadow):
        if res is not None:
            stages.wrap(res, "answer", "resident.answer")
            for attr in ("stage_ids", "fetch", "unpack_host"):
                stages.wrap(res, attr, attr)
    if rt._captured is not None:
        stages.wrap(rt._captured, "answer", "captured.answer")
    if rt._resident is not None and rt._resident.head is not None:  # the fused last layer's launch and wait
        from kernels import resident_head, spmm_cuda

        stages.wrap(spmm_cuda, "launch", "head.launch")
        stages.wrap(resident_head, "synchronize", "head.sync")


def main(argv: list[str] | None = None) -> int:
    ap = bench_runtime.parser(__doc__, VARIANTS, "cpu,gpu,gpu-graphs", batches="1,8,64", sets=200)
    ap.add_argument("--profile", action="store_true", help="GPU: a torch.profiler pass over one-target batches")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    servers = bench_runtime.start_variants(ap, VARIANTS, args.variants, args.repo, args.data)

    rng = np.random.default_rng(0)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print("## Where a small batch's time goes (`benchmarks/one_node.py`)\n")
    print(f"`python benchmarks/one_node.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    print(f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, {device}; us per batch "
          f"(host time, summed per stage over {args.sets} batches / {args.sets}), median of {args.rounds} "
          "interleaved rounds\n")
    print("| model | variant | targets | path | " + " | ".join(STAGES) + " |")
    print("|---|---|---|---|" + "---|" * len(STAGES))
    profile_rt = None
    try:
        for model in [m for m in args.models.split(",") if m]:
            rts = {v: s.server.registry.get(model) for v, s in servers.items()}
            with torch.inference_mode():
                for rt in rts.values():
                    rt.warm_projections()
            lim = next(iter(rts.values())).limits
            width = lim.default_sampling_width

            def run(rt: Any, nodes: np.ndarray, lim: Any = lim, width: int = width) -> str:
                return str(bench_runtime.process(rt, nodes, width, lim.default_ppr_budget).path)

            for size in (min(int(b), lim.num_nodes) for b in args.batches.split(",") if b):
                per: dict[str, list[dict[str, float]]] = {v: [] for v in rts}
                paths: dict[str, str] = {}
                for rt in rts.values():  # untimed: first use (a width's table, a CUDA graph capture)
                    for _ in range(3):
                        run(rt, np.sort(rng.choice(lim.num_nodes, size, replace=False)).astype(np.int64))
                    if rt._resident is not None:
                        rt._resident.wait_for_builds()
                for _ in range(args.rounds):
                    for v, rt in rts.items():
                        batches = [np.sort(rng.choice(lim.num_nodes, size, replace=False)).astype(np.int64)
                                   for _ in range(args.sets)]
                        stages = Stages()
                        instrument(rt, stages)
                        if rt._captured is not None:
                            stages.wrap(torch.cuda.CUDAGraph, "replay", "CUDAGraph.replay")
                        try:
                            for nodes in batches:
                                paths[v] = run(rt, nodes)
                        finally:
                            stages.restore()
                        per[v].append({k: stages.ns[k] / args.sets / 1e3 for k in STAGES})
                for v in rts:
                    med = {k: statistics.median(r[k] for r in per[v]) for k in STAGES}
                    print(f"| {model} | {v} | {size} | {paths[v]} | "
                          + " | ".join(f"{med[k]:.1f}" if med[k] else "-" for k in STAGES) + " |", flush=True)
                if args.profile and "gpu" in rts and size == 1 and profile_rt is None:
                    profile_rt = (model, rts["gpu"], run)
        if profile_rt is not None:
            model, rt, run = profile_rt
            from torch.profiler import ProfilerActivity, profile

            batches = [np.array([int(i)], dtype=np.int64) for i in rng.choice(lim.num_nodes, 200)]
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for nodes in batches:
                    run(rt, nodes)
            print(f"\n`torch.profiler`, {model}, 200 one-target batches on the `gpu` variant:\n")
            print("```")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
            print("```")
    finally:
        for s in servers.values():
            s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
