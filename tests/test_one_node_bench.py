"""benchmarks/one_node.py at a small size: real runtimes of a trained repository, the stage split of a
small batch on the compiled CPU path and on the resident path (on the CPU, where the device stages run
too), and the script's wrappers removed afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_one_node_stages(tiny_repo: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "one_node.py"), "--repo", str(tiny_repo),
                           "--models", "gcn,shadow", "--batches", "1,4", "--sets", "5", "--rounds", "2",
                           "--variants", "cpu,cpu-resident"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| gcn") or
            line.startswith("| shadow")]
    by = {(r[0].strip(), r[1].strip(), int(r[2])): [c.strip() for c in r[3:]] for r in rows}
    assert set(by) == {(m, v, b) for m in ("gcn", "shadow") for v in ("cpu", "cpu-resident") for b in (1, 4)}
    for (model, variant, _), cells in by.items():
        path, process, run, _captured, answer, stage_ids, _replay, fetch, launch, sync, unpack = cells
        assert launch == sync == "-", cells  # the fused last layer's stages: a GPU only
        assert float(process) >= float(run) > 0, cells  # the path's run is part of process
        if variant == "cpu-resident":
            assert path == ("plain-resident" if model == "gcn" else "shadow-resident"), cells
            assert float(run) >= float(answer) >= float(stage_ids) > 0 and float(fetch) > 0 and float(unpack) > 0
        else:
            assert "resident" not in path and answer == stage_ids == "-", cells
