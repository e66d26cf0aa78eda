"""Like for like with the ES-SpMM paper (issue #22 item 4): aggregation time summed over a whole inference,
and test accuracy, at sampling widths S = 16 .. 512.

The paper (Lin, Luo and Ceze; ``../shared/papers/es-spmm.txt``, Section V and Figure 8) trains GCN and
GraphSAGE-mean once per dataset, then runs full-graph inference with DGL's cuSPARSE SpMM and with
ES-SpMM at each S, and reports the SpMM kernel time of one inference (PyTorch profiler), the test
accuracy and the sampling rate (its Table IV). This script does the same with gnnserve's pieces:

* **graphs**: the shared real datasets (``cora``, ``citeseer``, ``amazon_computers``, ...) and synthetic
  graphs shaped like the paper's (``pubmed-like``: 19,717 nodes, mean degree 4.5, 3 classes;
  ``arxiv-like``: 169,343, 13.7, 40; ``reddit-like``: 232,965, 493, 41), stochastic block models with
  class-correlated features (:func:`kernels.datasets.synthetic_sbm`), so accuracy depends on the graph;
* **models**: trained here with :func:`models.fit.fit` (full batch, 2 layers);
* **time**: per inference, the sum over both layers of the aggregation call alone
  (``conv.aggregate``: :func:`kernels.sampled_spmm`, the ES-SpMM CUDA kernel on a GPU), measured with
  CUDA events around each call on a GPU (device time) and the wall clock on a CPU; the baseline is
  ``torch.sparse.mm`` (cuSPARSE on a GPU, MKL on a CPU) on the pre-normalised adjacency (GCN:
  :math:`D^{-1/2}(A + I)D^{-1/2}`; SAGE: the row-mean matrix on the neighbour half), the layer's dense
  transform outside the timed part in both. Median of ``--rounds`` inferences, the baseline and every
  setting interleaved round by round in a rotating order;
* **accuracy**: test accuracy of the full-graph forward at each S (``model(graph, x, S)``) and of the
  baseline's exact forward; **kept**: ``sum_i min(d_i, S) / E``.

    python benchmarks/paper.py                                  # cora, citeseer, pubmed-like, arxiv-like
    python benchmarks/paper.py --graphs reddit-like --device cuda --widths 16,32,64,128,256,512
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: synthetic graphs shaped like the paper's Table I: (nodes, mean-degree argument, classes, features, hidden)
SHAPES = {
    "pubmed-like": (19_717, 5.0, 3, 500, 32),
    "arxiv-like": (169_343, 15.0, 40, 128, 128),
    "reddit-like": (232_965, 540.0, 41, 602, 128),
}
DEFAULT_GRAPHS = "cora,citeseer,pubmed-like,arxiv-like"


def load(name: str, data_dir: Path):
    from kernels.datasets import load_dataset, synthetic_sbm

    if name in SHAPES:
        n, deg, classes, feats, _ = SHAPES[name]
        return synthetic_sbm(n, num_classes=classes, avg_degree=deg, num_features=feats, feature_signal=0.25,
                             train_per_class=20, seed=1, name=name)
    if name.startswith("synthetic"):  # a load_dataset spec: synthetic[:N[:seed]]
        return load_dataset(name)
    path = data_dir / f"{name}.npz"
    if not path.exists():
        raise SystemExit(f"{path} not found (--data-dir)")
    return load_dataset(str(path))


def baseline_matrix(graph, arch: str, device: torch.device) -> torch.Tensor:
    """The adjacency the baseline multiplies by, as a torch CSR: GCN's normalised ``A + I``, SAGE's row mean."""
    import scipy.sparse as sp

    a = graph.to_scipy().astype(np.float32)
    n = graph.num_nodes
    if arch == "gcn":
        dinv = np.asarray((1.0 + a.sum(axis=1)).A1, dtype=np.float64) ** -0.5
        m = sp.diags(dinv) @ (a + sp.identity(n, dtype=np.float32, format="csr")) @ sp.diags(dinv)
    else:
        deg = np.diff(a.indptr).astype(np.float64)
        m = sp.diags(np.where(deg > 0, 1.0 / np.maximum(deg, 1), 0.0)) @ a
    m = sp.csr_matrix(m, dtype=np.float32)
    m.sort_indices()
    crow, col = torch.from_numpy(m.indptr.astype(np.int64)), torch.from_numpy(m.indices.astype(np.int64))
    return torch.sparse_csr_tensor(crow, col, torch.from_numpy(m.data), size=(n, n), check_invariants=False).to(device)


HOLD_S = 500e-6  # longer than any one aggregation call takes to issue on the host


class Timer:
    """Sums the time of the calls it wraps: CUDA events on a GPU (device time), the wall clock on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.events: list = []
        self.wall = 0.0

    def __call__(self, fn, *args):
        if self.device.type == "cuda":
            from kernels.spmm_cuda import hold_stream

            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            hold_stream(HOLD_S)  # the call's kernels queue behind it: the events bracket them, not their issue
            a.record()
            out = fn(*args)
            b.record()
            self.events.append((a, b))
            return out
        t0 = time.perf_counter()
        out = fn(*args)
        self.wall += time.perf_counter() - t0
        return out

    def ms(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return sum(a.elapsed_time(b) for a, b in self.events)
        return self.wall * 1e3


def inference(model, graph, x, width: int | None, strategy: str, timer: Timer, baseline: torch.Tensor | None):
    """Full-graph logits, every layer's aggregation through ``timer``: ES-SpMM (``sampled_spmm``, the
    aggregation the model's own layers call) or the baseline's ``torch.sparse.mm``, each timed alone on
    the same operand; the self term and bias are added outside the timer on both sides."""
    from kernels.spmm import sampled_spmm

    p = model.project(x)
    h = p
    last = len(model.convs) - 1
    for i, conv in enumerate(model.convs):
        t = p if i == 0 else conv.transform(h)
        if model.arch == "gcn":
            h = (timer(sampled_spmm, graph, t, width, strategy, "gcn") if baseline is None
                 else timer(torch.sparse.mm, baseline, t))
        else:
            o = conv.out_channels
            z = t[:, o:].contiguous()
            h = t[:, :o] + (timer(sampled_spmm, graph, z, width, strategy, "mean") if baseline is None
                            else timer(torch.sparse.mm, baseline, z))
        if conv.bias is not None:
            h = h + conv.bias
        if i < last:
            h = torch.relu(h)
    return h


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default=DEFAULT_GRAPHS, help=f"comma list: shared datasets and {', '.join(SHAPES)}")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--widths", default="16,32,64,128,256,512")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5, help="timed inferences per setting (median reported)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--strategy", choices=("fastrand", "bucket"), default="fastrand")
    ap.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data")
    args = ap.parse_args(argv)

    from kernels.malloc import tune_malloc
    from kernels.spmm import kept_edges

    # keep freed memory for reuse (kernels/malloc.py): without it every full-graph output was a fresh mmap, and
    # its page faults made arxiv-like's passes bimodal (23-31 ms against 85-131 ms for one F = 128 pass, 2026-11-26)
    tune_malloc()
    from models.fit import TrainConfig, fit

    device = torch.device(args.device)
    widths = [int(w) for w in args.widths.split(",") if w]
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU"
    clock = "device time (CUDA events)" if device.type == "cuda" else "wall clock"
    print("## Like for like with the ES-SpMM paper (`benchmarks/paper.py`)\n")
    print(f"`python benchmarks/paper.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    print(f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, {dev_name}, torch "
          f"{torch.__version__}; aggregation ms per full-graph inference ({clock}, both layers, median of "
          f"{args.rounds}), strategy {args.strategy}\n")
    print("| graph | model | S | kept | test acc | ES-SpMM ms | baseline ms | speedup |")
    print("|---|---|---|---|---|---|---|---|")
    for gname in [g for g in args.graphs.split(",") if g]:
        t0 = time.perf_counter()
        ds = load(gname, args.data_dir)
        print(f"[{time.perf_counter() - t0:6.1f} s] {gname}: {ds.num_nodes:,} nodes, {ds.graph.num_edges:,} edges",
              file=sys.stderr, flush=True)
        graph = ds.graph
        x = torch.from_numpy(np.ascontiguousarray(ds.x, dtype=np.float32)).to(device)
        y = torch.from_numpy(np.asarray(ds.y)).to(device)
        test = torch.from_numpy(np.asarray(ds.test_mask)).to(device)
        for arch in [m for m in args.models.split(",") if m]:
            hidden = SHAPES[gname][4] if gname in SHAPES else 64
            t0 = time.perf_counter()
            res = fit(ds, TrainConfig(model=arch, hidden=hidden, layers=2, epochs=args.epochs, patience=args.epochs,
                                      knob_widths=(0,), device=str(device)))
            print(f"[{time.perf_counter() - t0:6.1f} s]   {arch} trained ({res.epochs_run} epochs)", file=sys.stderr,
                  flush=True)
            model = res.model.eval()
            base = baseline_matrix(graph, arch, device)

            # the baseline, exact and every width: one inference each per round, in a rotating order, so that
            # a stall of the machine hits every setting alike (round 0 is a warm-up: memoized arrays, samples)
            settings: list[tuple[str, int | None, torch.Tensor | None]] = [
                ("baseline", None, base), ("exact", None, None), *[(str(w), w, None) for w in widths]]
            times: dict[str, list[float]] = {name: [] for name, _, _ in settings}
            accs: dict[str, float] = {}
            for r in range(args.rounds + 1):
                shift = r % len(settings)
                for name, width, baseline in settings[shift:] + settings[:shift]:
                    timer = Timer(device)
                    with torch.inference_mode():
                        logits = inference(model, graph, x, width, args.strategy, timer, baseline)
                    if r:
                        times[name].append(timer.ms())
                    else:
                        accs[name] = float((logits.argmax(1) == y)[test].float().mean())
            ms = {name: statistics.median(v) for name, v in times.items()}
            base_ms = ms["baseline"]
            print(f"| {gname} | {arch} | exact | 100.0% | {accs['exact']:.2%} (baseline {accs['baseline']:.2%}) | "
                  f"{ms['exact']:.3f} | {base_ms:.3f} | {base_ms / ms['exact']:.2f}x |", flush=True)
            for w in widths:
                kept = kept_edges(graph, w) / max(1, graph.num_edges)
                print(f"| {gname} | {arch} | {w} | {kept:.1%} | {accs[str(w)]:.2%} | {ms[str(w)]:.3f} | {base_ms:.3f} | "
                      f"{base_ms / ms[str(w)]:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
