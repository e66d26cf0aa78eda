"""Test accuracy of every gnnserve model next to a PyG model of the same architecture (issue 4).

For each dataset and model kind, one process trains, seed by seed:

* **ours**: :func:`models.train.fit` (the training module as ``gnnserve train`` runs it, without
  writing a checkpoint), then test accuracy at exact aggregation and at sampling widths
  ``--widths`` (ES-SpMM ``fastrand``): plain models on the full graph (identical to their exact
  L-hop serving path), shaDow models on their PPR subgraphs at ``K = --ppr-k``;
* **PyG**: the same architecture built from ``torch_geometric.nn`` (``GCNConv`` with self-loops
  and symmetric normalisation, ``SAGEConv`` with the mean aggregator and root weight; for shaDow,
  the same backbone on the *same* PPR subgraph batches with target readout + mean pooling), with
  the same hyper-parameters, feature normalisation (fitted on the training nodes), dropout, Adam
  settings, epochs and early stopping on validation accuracy, always exact aggregation. The twin
  gets the graph as PyG's ``adj_t`` (the layers' fused sparse-matmul path) and the same input as
  ours: sparse COO for bag-of-words features, with dropout on the stored values (``SAGEConv``
  applies ``lin_l``'s weight before the mean for such inputs; see :func:`_sage_conv`). With dense
  inputs and ``edge_index`` the twin ran 1,600 to 3,000 s per Coauthor CS seed (6,805 features).

Prints one Markdown table (mean ± standard deviation over seeds, in %) plus a JSON line per
(dataset, model, implementation, seed) on stderr with ``--jsonl``.

    python benchmarks/accuracy.py                                    # 5 datasets, 4 models, 3 seeds
    python benchmarks/accuracy.py --datasets cora,citeseer --seeds 5
    python benchmarks/accuracy.py --datasets cora --models gcn --seeds 1 --epochs 50   # quick look
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from kernels.datasets import load_dataset
from models.base import dropout_any
from models.norm import FeatureNorm
from models.train import (
    EarlyStopping,
    PPRExtractor,
    TrainConfig,
    TrainData,
    _batches,
    evaluate,
    fit,
    make_ppr_config,
    ppr_table,
)

DEFAULT_DATA = Path(os.environ.get("GNNSERVE_DATA", Path(__file__).resolve().parent.parent.parent / "shared" / "data"))
DATASETS = ("cora", "citeseer", "amazon_computers", "amazon_photo", "coauthor_cs")
KINDS = ("gcn", "sage", "shadow-gcn", "shadow-sage")


# ============================================================================ PyG reference models
def _sage_conv(a: int, b: int) -> nn.Module:
    """PyG's ``SAGEConv(a, b, aggr="mean")`` that also takes a sparse COO input.

    ``SAGEConv`` aggregates ``x`` and then applies ``lin_l``, which needs a dense ``x`` and, for wide
    bag-of-words features (Coauthor CS: 6,805 wide, 0.9 % non-zero), a ``[n, F]`` mean that is 8x
    denser than ``x``. For a sparse ``x`` this subclass applies ``lin_l``'s weight first and takes
    the mean of the ``b``-wide rows with PyG's ``spmm`` (equal: the mean is linear), then adds
    ``lin_l``'s bias and ``lin_r(x)``. Parameters, initialisation and the dense path are PyG's own;
    ``tests/test_pyg_twin.py`` checks it against our GraphSAGE on dense and sparse inputs.
    """
    from torch_geometric.nn import SAGEConv
    from torch_geometric.utils import spmm

    class SparseInputSAGEConv(SAGEConv):
        def forward(self, x, edge_index, size=None):  # type: ignore[override]
            if x.layout == torch.strided:
                return super().forward(x, edge_index, size)
            assert self.root_weight and not self.project and not self.normalize
            neigh = spmm(edge_index, torch.sparse.mm(x, self.lin_l.weight.t()), reduce="mean")
            return neigh + self.lin_l.bias + self.lin_r(x)

    return SparseInputSAGEConv(a, b, aggr="mean")


class PygPlain(nn.Module):
    """``dropout -> conv -> relu`` x (L-1), then ``dropout -> conv`` to classes (as models.gcn/sage).

    ``adj_t`` is the graph as PyG's transposed sparse adjacency (a torch CSR tensor, row = the node
    aggregated into), the layers' fused ``spmm`` path; the input ``x`` may be sparse COO (dropout on
    its stored values, as ours).
    """

    def __init__(self, kind: str, in_dim: int, hidden: int, classes: int, layers: int, dropout: float) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        dims = [in_dim] + [hidden] * (layers - 1) + [classes]
        make = (lambda a, b: GCNConv(a, b, cached=True)) if kind == "gcn" else _sage_conv
        self.convs = nn.ModuleList(make(a, b) for a, b in itertools.pairwise(dims))
        self.dropout = dropout

    def forward(self, x: torch.Tensor, adj_t: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(dropout_any(x, self.dropout, self.training), adj_t)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


class PygShadow(nn.Module):
    """shaDow: L backbone layers with relu on the subgraphs, readout = target row ++ mean pool, linear."""

    def __init__(self, backbone: str, in_dim: int, hidden: int, classes: int, layers: int, dropout: float) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        dims = [in_dim] + [hidden] * layers
        make = (lambda a, b: GCNConv(a, b)) if backbone == "gcn" else _sage_conv
        self.convs = nn.ModuleList(make(a, b) for a, b in itertools.pairwise(dims))
        self.classifier = nn.Linear(2 * hidden, classes)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, adj_t: torch.Tensor, batch: torch.Tensor, targets: torch.Tensor,
                num_graphs: int) -> torch.Tensor:
        from torch_geometric.nn import global_mean_pool

        for conv in self.convs:
            x = F.relu(conv(dropout_any(x, self.dropout, self.training), adj_t))
        r = torch.cat([x[targets], global_mean_pool(x, batch, num_graphs)], dim=1)
        return self.classifier(F.dropout(r, self.dropout, self.training))


def twin_state_from(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s weights (a gnnserve GCN, GraphSAGE or shaDow model) as its PyG twin's state dict.

    GCN layer ``i``: ``weight``/``bias`` -> ``GCNConv.lin.weight``/``bias``; GraphSAGE layer ``i``:
    ``weight_neigh``/``bias``/``weight_root`` -> ``SAGEConv.lin_l.weight``/``lin_l.bias``/``lin_r.weight``;
    the shaDow classifier as is. (``tests/test_pyg_twin.py`` trains both from the same weights.)
    """
    sd = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for i in range(len(model.convs)):
        p = f"convs.{i}."
        if p + "weight" in sd:
            out[p + "lin.weight"], out[p + "bias"] = sd[p + "weight"], sd[p + "bias"]
        else:
            out[p + "lin_l.weight"], out[p + "lin_l.bias"] = sd[p + "weight_neigh"], sd[p + "bias"]
            out[p + "lin_r.weight"] = sd[p + "weight_root"]
    out.update({k: v for k, v in sd.items() if k.startswith("classifier.")})
    return out


def _adj_t(g) -> torch.Tensor:
    """The CSR graph as PyG's ``adj_t``: row ``i`` lists the neighbours aggregated INTO ``i``."""
    ip = torch.from_numpy(np.asarray(g.indptr, dtype=np.int64))
    idx = torch.from_numpy(np.asarray(g.indices, dtype=np.int64))
    return torch.sparse_csr_tensor(ip, idx, torch.ones(len(idx)), size=(len(ip) - 1, len(ip) - 1),
                                   check_invariants=False)


def _shadow_inputs(b, data: TrainData):
    sizes = np.diff(b.ptr)
    batch = torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes))
    return (data.rows(b.node_ids), _adj_t(b.graph), batch, torch.from_numpy(np.asarray(b.target_rows)),
            len(sizes))


def train_pyg(kind: str, data: TrainData, cfg: TrainConfig, extractor) -> tuple[float, int]:
    """Train the PyG twin with ``cfg``'s settings; returns (test accuracy, epochs run)."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    x = data.xn  # sparse COO for sparse bag-of-words features, as ours trains on
    ds = data.ds
    shadow = kind.startswith("shadow-")
    if shadow:
        model: nn.Module = PygShadow(kind.split("-")[1], ds.num_features, cfg.hidden, ds.num_classes,
                                     int(cfg.layers), cfg.dropout)
    else:
        model = PygPlain(kind, ds.num_features, cfg.hidden, ds.num_classes, int(cfg.layers), cfg.dropout)
        adj_full = _adj_t(ds.graph)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    y = data.y

    def logits_of(nodes: np.ndarray) -> torch.Tensor:
        if not shadow:
            return model(x, adj_full)[torch.from_numpy(nodes)]
        outs = []
        for i in range(0, len(nodes), cfg.eval_batch_size):
            b = extractor.batch(nodes[i : i + cfg.eval_batch_size], cfg.ppr_k)
            outs.append(model(*_shadow_inputs(b, data)))
        return torch.cat(outs)

    stopper = EarlyStopping(cfg.patience)
    epochs = 0
    for epoch in range(cfg.epochs):
        model.train()
        if shadow:
            for chunk in _batches(rng.permutation(data.train), cfg.batch_size):  # fit's batches
                b = extractor.batch(chunk, cfg.ppr_k)
                opt.zero_grad()
                loss = F.cross_entropy(model(*_shadow_inputs(b, data)), y[torch.from_numpy(chunk)])
                loss.backward()
                opt.step()
        else:
            opt.zero_grad()
            out = model(x, adj_full)
            tr = torch.from_numpy(data.train)
            F.cross_entropy(out[tr], y[tr]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            lv = logits_of(data.val)
            yv = y[torch.from_numpy(data.val)]
            acc = (lv.argmax(1) == yv).float().mean().item()
            loss_v = F.cross_entropy(lv, yv).item()
        epochs = epoch + 1
        if stopper.step(epoch, acc, loss_v, model):
            break
    model.load_state_dict(stopper.best_state)
    model.eval()
    with torch.no_grad():
        lt = logits_of(data.test)
    return (lt.argmax(1) == y[torch.from_numpy(data.test)]).float().mean().item(), epochs


# ============================================================================ the run
def run(args: argparse.Namespace) -> list[dict]:
    rows: list[dict] = []
    widths = [int(w) for w in args.widths.split(",") if w]
    for name in args.datasets.split(","):
        path = args.data_dir / f"{name}.npz"
        if not path.exists():
            print(f"<!-- {name}: {path} missing, skipped -->", flush=True)
            continue
        ds = load_dataset(path)
        need = np.concatenate([ds.split("train"), ds.split("val"), ds.split("test")])
        table = None
        for kind in args.models.split(","):
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                layers = args.shadow_layers if kind.startswith("shadow-") else None
                cfg = TrainConfig(model=kind, hidden=args.hidden, epochs=args.epochs, patience=args.patience,
                                  seed=seed, ppr_k=args.ppr_k, dropout=args.dropout, layers=layers)
                if cfg.is_shadow and table is None:
                    t0 = time.perf_counter()
                    table = ppr_table(ds.graph, need, make_ppr_config(cfg.ppr, cfg.ppr_k), cfg.ppr_k)
                    print(f"<!-- {name}: PPR top-{cfg.ppr_k} for {len(need)} nodes in "
                          f"{time.perf_counter() - t0:.1f} s -->", flush=True)
                t0 = time.perf_counter()
                res = fit(ds, cfg, ppr_lookup=table if cfg.is_shadow else None)
                t_ours = time.perf_counter() - t0
                row = {"dataset": name, "model": kind, "layers": int(cfg.layers), "seed": seed,
                       "ours_exact": res.test_accuracy,
                       "ours_epochs": res.epochs_run, "ours_s": t_ours}
                for w in widths:
                    row[f"ours_w{w}"] = evaluate(res.model, res.data, res.data.test, width=w, strategy="fastrand",
                                                 extractor=res.extractor if cfg.is_shadow else None,
                                                 k=cfg.ppr_k, batch_size=cfg.eval_batch_size)[0]
                norm = FeatureNorm(ds.num_features, cfg.feature_norm, cfg.binarize).fit(ds.x, ds.split("train"))
                data = TrainData(ds, norm)
                extractor = PPRExtractor(ds.graph, table) if cfg.is_shadow else None
                t0 = time.perf_counter()
                row["pyg_exact"], row["pyg_epochs"] = train_pyg(kind, data, cfg, extractor)
                row["pyg_s"] = time.perf_counter() - t0
                rows.append(row)
                if args.jsonl:
                    print(json.dumps(row), file=sys.stderr, flush=True)
                print(f"<!-- {name} {kind} seed {seed}: ours {100 * row['ours_exact']:.1f} "
                      f"({t_ours:.0f} s), pyg {100 * row['pyg_exact']:.1f} ({row['pyg_s']:.0f} s) -->", flush=True)
    return rows


def _fmt(vals: list[float]) -> str:
    m = 100 * statistics.fmean(vals)
    s = 100 * statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{m:.1f} ± {s:.1f}"


def table(rows: list[dict], widths: list[int]) -> str:
    head = ["dataset", "model", "seeds", "ours exact", *[f"ours S={w}" for w in widths], "PyG exact",
            "ours − PyG (pp)", f"S={widths[1] if len(widths) > 1 else widths[0]} − exact (pp)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted({(r["dataset"], r["model"], r.get("layers", 0)) for r in rows},
                  key=lambda k: (DATASETS.index(k[0]) if k[0] in DATASETS else 99, KINDS.index(k[1]), k[2]))
    w_mid = widths[1] if len(widths) > 1 else widths[0]
    for ds, kind, layers in keys:
        rs = [r for r in rows if r["dataset"] == ds and r["model"] == kind and r.get("layers", 0) == layers]
        ours = [r["ours_exact"] for r in rs]
        pyg = [r["pyg_exact"] for r in rs]
        label = f"{kind} (L = {layers})" if kind.startswith("shadow-") and layers else kind
        cells = [ds, label, str(len(rs)), _fmt(ours), *[_fmt([r[f"ours_w{w}"] for r in rs]) for w in widths], _fmt(pyg),
                 f"{100 * (statistics.fmean(ours) - statistics.fmean(pyg)):+.1f}",
                 f"{100 * statistics.fmean([r[f'ours_w{w_mid}'] - r['ours_exact'] for r in rs]):+.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from kernels.malloc import tune_malloc

    tune_malloc()  # keep freed memory for reuse (see kernels/malloc.py)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--models", default=",".join(KINDS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds run are first-seed .. first-seed + seeds - 1 (adds seeds to an earlier run's rows)")
    ap.add_argument("--widths", default="8,16,32")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--patience", type=int, default=50)
    ap.add_argument("--ppr-k", type=int, default=64)
    ap.add_argument("--shadow-layers", type=int, default=None,
                    help="depth of the shaDow models (default: the training module's, 1 for shaDow-SAGE and 3 for "
                         "shaDow-GCN); plain models keep 2")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--jsonl", action="store_true", help="one JSON line per run on stderr")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    print(f"Command: `python benchmarks/accuracy.py {' '.join(argv if argv is not None else sys.argv[1:])}`  ")
    print(f"Date: {datetime.date.today()}; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads)  ", flush=True)
    rows = run(args)
    widths = [int(w) for w in args.widths.split(",") if w]
    print()
    print(table(rows, widths))
    print(f"\nTotal {time.perf_counter() - t0:.0f} s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
