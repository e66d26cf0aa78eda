"""CPU against GPU through ``ModelRuntime.process``: where ``--gpu-min-targets`` comes from.

Loads a model repository the way the server does (one ``BackgroundServer`` per variant, projection
tables filled first, no gRPC on the timed path) and times ``process`` on batches of ``B`` random
distinct targets at each model's default setting, the variants interleaved round by round:

* ``cpu``: ``--device cpu`` (the compiled forward, ``kernels.fused_forward``);
* ``cuda``: ``--device cuda --no-resident --gpu-min-targets 0`` (every batch on the GPU: the torch path
  with the ES-SpMM CUDA kernel);
* ``cuda-hybrid``: the same with the torch path's default ``--gpu-min-targets`` (smaller batches on the
  compiled CPU forward);
* ``cpu-resident``, ``cuda-resident``: ``--resident`` (the graph and first-layer tables, or a shaDow
  model's lists and induced table, on the device, sampling there: ``kernels.resident``; on the GPU with
  ``--no-cuda-graphs --no-fused-head --no-fused-shadow --gpu-min-targets 0``, every batch there: the torch
  operators); ``cuda-graphs``: the same
  with CUDA graphs (one captured CUDA graph per batch bucket, width and budget);
* ``cuda-fused``: resident with ``--fused-head --fused-shadow --gpu-min-targets 0``: a plain model's last
  layer in one kernel (``kernels.resident_head``), a shaDow model's whole batch in one (``kernels.shadow_block``);
* ``cuda-default``: ``--device cuda`` on its defaults (resident, the fused last layer for plain models, the
  whole batch in one kernel for shaDow since 2026-11-27, batches under the measured crossover
  ``serve.runtime.GPU_MIN_TARGETS_AUTO`` on the compiled CPU paths).

Reported: the median over rounds of the mean time per batch, each variant over ``cpu``, and the
serving path each variant's last batch took. The ``cuda`` variants are left out where torch sees no
GPU.

    python benchmarks/serve.py --datasets amazon_computers --models gcn,shadow-gcn --cache-dir DIR --train-only
    python benchmarks/device_split.py --repo DIR/amazon_computers/repo --data ../shared/data/amazon_computers.npz \
        --models gcn,shadow-gcn
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "benchmarks"))  # bench_runtime, also when loaded as a module (after REPO: serve.py)

import bench_runtime  # noqa: E402

VARIANTS = {"cpu": {"device": "cpu"}, "cuda": {"device": "cuda", "resident": False, "gpu_min_targets": 0},
            "cuda-hybrid": {"device": "cuda", "resident": False}, "cpu-resident": {"device": "cpu", "resident": True},
            "cuda-resident": {"device": "cuda", "resident": True, "cuda_graphs": False, "fused_head": False,
                              "fused_shadow": False, "gpu_min_targets": 0},
            "cuda-graphs": {"device": "cuda", "resident": True, "cuda_graphs": True, "fused_head": False,
                            "fused_shadow": False, "gpu_min_targets": 0},
            "cuda-fused": {"device": "cuda", "resident": True, "fused_head": True, "fused_shadow": True,
                           "gpu_min_targets": 0},
            "cuda-default": {"device": "cuda"}}
DEFAULT_VARIANTS = "cpu,cuda,cuda-hybrid,cuda-resident,cuda-graphs,cuda-fused,cuda-default"


def main(argv: list[str] | None = None) -> int:
    ap = bench_runtime.parser(__doc__, VARIANTS, DEFAULT_VARIANTS, batches="1,8,16,32,64,128,256,1024", sets=40)
    ap.add_argument("--width", type=int, default=None, help="sampling width (default: each model's default)")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from kernels.resident import CAPTURE_AFTER

    servers = bench_runtime.start_variants(ap, VARIANTS, args.variants, args.repo, args.data)
    names = list(servers)
    sizes = [int(b) for b in args.batches.split(",") if b]
    rng = np.random.default_rng(0)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print("## CPU against GPU per batch (`benchmarks/device_split.py`)\n")
    print(f"`python benchmarks/device_split.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    print(f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, {device}; ms per "
          f"`ModelRuntime.process` call, median of {args.rounds} interleaved rounds of {args.sets} batches\n")
    others = [v for v in names if v != "cpu"] if "cpu" in names else []
    print("| model | width | targets | " + " | ".join(f"{v} ms" for v in names) + "".join(f" | {v} / cpu" for v in others)
          + " | paths |")
    print("|---|---|---|" + "---|" * (len(names) + len(others) + 1))
    try:
        for model in [m for m in args.models.split(",") if m]:
            rts = {v: s.server.registry.get(model) for v, s in servers.items()}
            with torch.inference_mode():
                for rt in rts.values():
                    rt.warm_projections()
            lim = next(iter(rts.values())).limits
            width = lim.default_sampling_width if args.width is None else args.width
            paths: dict[str, str] = {}

            def run(v, rt, nodes, lim=lim, width=width, paths=paths):
                paths[v] = bench_runtime.process(rt, nodes, width, lim.default_ppr_budget).path

            for size in sizes:
                size = min(size, lim.num_nodes)
                times: dict[str, list[float]] = {v: [] for v in rts}
                for v, rt in rts.items():  # untimed: first-use work (a resident width's table, CUDA graph capture)
                    run(v, rt, np.sort(rng.choice(lim.num_nodes, size, replace=False)).astype(np.int64))
                    if rt._resident is not None:  # a width outside the warm-up's: its table builds in the background
                        rt._resident.wait_for_builds()
                    for _ in range(CAPTURE_AFTER):  # a batch size's graph is captured on its second batch
                        run(v, rt, np.sort(rng.choice(lim.num_nodes, size, replace=False)).astype(np.int64))
                for _ in range(args.rounds):
                    for v, rt in rts.items():
                        batches = [np.sort(rng.choice(lim.num_nodes, size, replace=False)).astype(np.int64)
                                   for _ in range(args.sets)]
                        t0 = time.perf_counter()
                        for nodes in batches:
                            run(v, rt, nodes)
                        times[v].append((time.perf_counter() - t0) / args.sets * 1e3)
                med = {v: statistics.median(t) for v, t in times.items()}
                ratios = "".join(f" | {med[v] / med['cpu']:.2f}" for v in others)
                print(f"| {model} | {width} | {size} | " + " | ".join(f"{med[v]:.3f}" for v in names) + ratios
                      + " | " + ", ".join(f"{v}: {paths[v]}" for v in names) + " |", flush=True)
    finally:
        for s in servers.values():
            s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
