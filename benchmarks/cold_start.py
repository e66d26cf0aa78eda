"""How long a ``--device cuda`` server takes to start, on an empty and on a warm CuPy kernel cache.

A fresh GPU machine's first start compiles the CUDA kernels (NVRTC, through CuPy; CuPy keeps the binaries
in its disk cache, ``CUPY_CACHE_DIR``, for every later start). On the H200 on 2026-11-25 the first server
start of a fresh machine took 26 s against 2 s later. This times, for each way of building the ES-SpMM
kernel's modules (``GNNSERVE_CUDA_COMPILE``: ``module``, every 16 instances of a value type and split at
once, as before 2026-11-26; ``instance``, one module per instance on its first launch), in a fresh process
each:

* ``probe``: ``kernels.spmm_cuda.available()`` (CuPy's import, the CUDA context, the probe's launches);
* ``first calls``: one ``sampled_spmm`` at each of F = 64 and 256, sampled and exact (a few instances
  beside the probe's; a server may launch others, each compiled on its first launch), and the fused last
  layer's module (``kernels.resident_head``);
* ``server``: ``gnnserve serve --device cuda --read-only`` on a trained repository, from the process's
  start to its ready file (the resident state and its warm-up included),

each on empty cache directories (CuPy's kernel cache and numba's, which the server's update kernels fill
at start) and then again on the caches it filled. The run of 2026-11-26 had empty CuPy caches only: the
first server it started (``module``, the first on that machine) also compiled numba's kernels.

    python benchmarks/cold_start.py --repo DIR/amazon_computers/repo --data ../shared/data/amazon_computers.npz
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO / "benchmarks"))  # bench_runtime (appended: benchmarks/serve.py is no package)

import bench_runtime  # noqa: E402

_KERNELS = r"""
import json, time
t0 = time.perf_counter()
import torch
from kernels import spmm_cuda, resident_head
from kernels.graph import CSRGraph
import numpy as np
ok = spmm_cuda.available()
t1 = time.perf_counter()
rng = np.random.default_rng(0)
n = 20000
g = CSRGraph.from_edge_index(rng.integers(0, n, (2, 10 * n)), num_nodes=n, symmetrize=True)
for f in (64, 256):
    x = torch.randn(n, f, device="cuda")
    for w in (16, 0):
        spmm_cuda.sampled_spmm_cuda(g, x, w, "fastrand", "gcn")
torch.cuda.synchronize()
t2 = time.perf_counter()
resident_head._function(torch.cuda.current_device())
t3 = time.perf_counter()
print(json.dumps({"ok": ok, "probe": t1 - t0, "first calls": t2 - t1, "head": t3 - t2,
                  "modules": len(spmm_cuda._modules), "compile s": sum(spmm_cuda.compile_seconds)}))
"""


def _kernels(env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _KERNELS], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=600)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _server(env: dict[str, str], args: argparse.Namespace, work: Path) -> float:
    serve_args = ["--repo", str(args.repo), "--port", "0", "--read-only", "--poll-s", "0", "--device", "cuda",
                  *[a for d in args.data for a in ("--data", str(d))]]
    with bench_runtime.server_process(serve_args, env=env, log_path=work / "server.log", timeout_s=300) as took:
        return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, required=True, help="a trained model repository")
    ap.add_argument("--data", action="append", default=[], help="the dataset file(s) the repository names")
    ap.add_argument("--modes", default="module,instance", help="GNNSERVE_CUDA_COMPILE values, in order")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("cold_start.py: no CUDA device")
    print("## A `--device cuda` start, empty and warm CuPy kernel cache (`benchmarks/cold_start.py`)\n")
    print(f"`python benchmarks/cold_start.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    print(f"{datetime.date.today()}, {os.cpu_count()} CPUs, {torch.cuda.get_device_name()}; seconds, one run each\n")
    print("| compile | cache | probe s | first calls s | fused head s | modules | compiling s | server start s |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in [m for m in args.modes.split(",") if m]:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
            # the kernels and the server each on caches of their own (CuPy's kernels, numba's compiled
            # functions: the server's update kernels): each starts empty, then warm
            env_k = dict(os.environ, GNNSERVE_CUDA_COMPILE=mode, CUPY_CACHE_DIR=str(work / "k"),
                         NUMBA_CACHE_DIR=str(work / "kn"), PYTHONPATH=path)
            env_s = dict(env_k, CUPY_CACHE_DIR=str(work / "s"), NUMBA_CACHE_DIR=str(work / "sn"))
            for cache in ("empty", "warm"):
                k = _kernels(env_k)
                server = _server(env_s, args, work)
                print(f"| {mode} | {cache} | {k['probe']:.2f} | {k['first calls']:.2f} | {k['head']:.2f} | "
                      f"{k['modules']} | {k['compile s']:.2f} | {server:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
