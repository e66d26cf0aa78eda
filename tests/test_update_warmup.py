"""kernels.update_warmup: a server compiles its update kernels while it loads a model on a graph that can
take updates, so that the first UpdateGraph compiles nothing (it paid about 3 s with an empty numba cache: module docstring).

Checked in a fresh interpreter (compiled specializations are per process): a real server over the trained
tiny repository (a plain GCN and a shaDow model), ready, then real updates through the SDK, new node included:
numba compiles nothing during them, and the update path's outermost kernels hold the same signatures before and
after them. Without the warm-up the splice and the live PPR kernels were first compiled by the update itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
import numpy as np
from clients import GnnClient, NewNode
from kernels import graph_edit, plan, ppr_index, ppr_live, ppr_push
from serve.server import BackgroundServer, ServerConfig

from numba.core import event

# the update path's outermost kernels (their callees come with them: compiled inside them, or loaded with them
# from the cache that the server's precompiling processes filled)
FUNCS = {"graph_edit._splice": graph_edit._splice, "plan._walk_sums_rows": plan._walk_sums_rows,
         "ppr_live._accumulate": ppr_live._accumulate, "ppr_index._inverse_csr": ppr_index._inverse_csr,
         "ppr_live._reverse_accumulate": ppr_live._reverse_accumulate, "ppr_live._push_peaks": ppr_live._push_peaks,
         "ppr_push._ppr_batch": ppr_push._ppr_batch}
compiled = []


class Count(event.Listener):
    def on_start(self, ev):
        pass

    def on_end(self, ev):
        compiled.append(ev.data["dispatcher"].py_func.__qualname__)


repo = sys.argv[1]
srv = BackgroundServer(ServerConfig(repo=repo, port=0, poll_s=0)).start()
try:
    event.register("numba:compile", Count())  # from the server's ready on: what the updates compile
    before = {k: [str(s) for s in f.signatures] for k, f in FUNCS.items()}
    rt = srv.server.registry.get("gcn")
    with GnnClient(srv.address) as c:
        r1 = c.update_graph("shadow", add_edges=[(3, 500)])
        r2 = c.update_graph("gcn", remove_edges=[(3, 500)],
                            new_nodes=[NewNode(np.ones(int(rt.model.in_dim), np.float32), [7, 9])])
    after = {k: [str(s) for s in f.signatures] for k, f in FUNCS.items()}
    print(json.dumps({"before": before, "after": after, "versions": [r1.graph_version, r2.graph_version],
                      "compiled": compiled}))
finally:
    srv.stop()
"""


def test_the_first_update_compiles_nothing(tiny_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"  # its own copy: a server of the shared one may hold its update log
    shutil.copytree(tiny_repo, repo, ignore=shutil.ignore_patterns("_live"))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(repo)], capture_output=True, text=True,
                          timeout=900, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["versions"] == [1, 2]
    assert out["compiled"] == [], out["compiled"]  # numba compiled nothing during the updates
    for name, sigs in out["before"].items():
        assert sigs, f"{name}: not compiled by the warm-up"
        assert out["after"][name] == sigs, f"{name}: the first update compiled {set(out['after'][name]) - set(sigs)}"
