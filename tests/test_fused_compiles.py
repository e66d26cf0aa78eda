"""The compiled forwards share their big callees: ``_layers``, ``_aggregate`` and ``_aggregate_first`` (about
20 s of numba compilation as a set) compile once for the plain models' plans and shaDow's subgraph batches
alike. A literal ``0`` or ``False`` passed where the other caller passes a run-time value, or a global array
(typed read-only) where the other passes a writable one, is an argument type of its own and made numba
compile them again (26 s compiled twice; a first start about 18 s longer, 2026-11-27). Checked in a fresh
process on an empty numba cache (a function loaded from the cache never compiles its callees), counting
numba's compile events. The same run holds the start path (the forwards, the plans, the update and PPR
kernels) to no array assignment's shape check, whose error message numba compiles in about 3 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import torch
    from numba.core import event

    counts = {}

    class Count(event.Listener):
        def on_start(self, ev):
            pass

        def on_end(self, ev):
            if getattr(ev, "_exc_details", None) is not None:  # a failed attempt (is_failed reads inverted in 0.68)
                return
            d = ev.data["dispatcher"].py_func
            name = f"{d.__module__}.{d.__qualname__}"
            counts[name] = counts.get(name, 0) + 1

    event.register("numba:compile", Count())

    from kernels.fused_forward import plan_forward_cpu, plan_inner_cpu, plan_outer_cpu, shadow_forward_cpu
    from kernels.graph import CSRGraph
    from kernels.plan import execution_plan
    from kernels.subgraph import induced_batch, lhop_nodes
    from models import build_model
    from models.base import gcn_dinv32

    rng = np.random.default_rng(0)
    n, f = 40, 6
    src = rng.integers(0, n, 160)
    dst = rng.integers(0, n, 160)
    g = CSRGraph.from_edge_index(np.stack([src, dst]), n, symmetrize=True)
    x = torch.from_numpy(rng.normal(size=(n, f)).astype(np.float32))
    targets = np.array([1, 5, 9])
    torch.manual_seed(0)
    plain = build_model({"arch": "gcn", "in_dim": f, "hidden": 8, "num_classes": 3, "layers": 2,
                         "dropout": 0.0}).eval()
    shadow = build_model({"arch": "shadow-gcn", "backbone": "gcn", "in_dim": f, "hidden": 8, "num_classes": 3,
                          "layers": 2, "dropout": 0.0, "pool": "mean"}).eval()
    with torch.no_grad():
        ptable, stable = plain.project(x).numpy(), shadow.project(x).numpy()
    dinv = gcn_dinv32(g)
    params = plain.fused_params()
    plan_forward_cpu(execution_plan(g, targets, 2, 4, "fastrand"), params, ptable, dinv)
    everyone = execution_plan(g, np.arange(n), 1, 4, "fastrand")
    acts = np.zeros((n, plain.embedding_dim), np.float32)
    acts[everyone.node_ids[:n]] = plan_inner_cpu(everyone, params, ptable, dinv)
    plan_outer_cpu(execution_plan(g, targets, 1, 4, "fastrand"), params, acts, dinv)
    ptr, nodes = lhop_nodes(g, targets, 2)
    shadow_forward_cpu(induced_batch(g, ptr, nodes), shadow.fused_params(), stable, 4, "fastrand")
    from kernels.ppr_push import PPRConfig
    from kernels.update_warmup import warm_update_kernels

    warm_update_kernels(g, PPRConfig(), layers=2)  # the CSR splice, walk sums, a PPR index's build and refresh
    print(json.dumps(counts))
""")


def test_the_forwards_compile_their_shared_callees_once(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    ff = "kernels.fused_forward."
    assert counts.get(ff + "_shadow") == 1 and counts.get(ff + "_inner") == 1, counts  # all four entries ran
    assert counts.get(ff + "_outer") == 1 and counts.get(ff + "_plain") == 1, counts
    assert counts.get(ff + "_aggregate") == 1, counts
    assert counts.get(ff + "_aggregate_first") == 1, counts
    assert counts.get(ff + "_layers") == 1, counts  # _plain's relu_last and keep typed as _inner's and _shadow's
    assert counts.get("kernels.graph_edit._splice", 0) >= 1 and counts.get("kernels.ppr_push._ppr_batch", 0) >= 1, counts
    # no array assigned to a slice (or a row) anywhere on these paths: numba compiles such an assignment's shape
    # check with its error message, about 3 s of string formatting in a fresh process (kernels.subgraph.copy_run)
    assert not [k for k in counts if "raise_with_shape_context" in k], counts
