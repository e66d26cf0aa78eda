"""`gnnserve serve` refuses, at start, budgets and data that exceed the machine's memory (serve/memory_budget.py).

Through the real console entry (a subprocess `gnnserve serve ...`), on a tiny checkpoint."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serve.memory_budget import estimate, machine_memory_bytes

_SCRIPT = Path(sys.executable).parent / "gnnserve"  # the console script `pip install` made
GNNSERVE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "import sys; from serve.cli import main; sys.exit(main())"]
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from models.train import train

    root = tmp_path_factory.mktemp("membudget")
    train("synthetic:300", "gcn", root / "m" / "1", progress=False, epochs=2, patience=2, knob_widths=(0, 4),
          knob_accuracy_nodes=30, knob_latency_nodes=10, knob_repeats=1)
    return root


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([*GNNSERVE, "serve", *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=REPO_ROOT)


def test_machine_memory_is_read() -> None:
    mem = machine_memory_bytes()
    assert mem is not None and mem > 256 << 20


def test_absurd_budget_is_refused_through_the_cli(repo: Path) -> None:
    absurd = str(1 << 60)  # an exbibyte of activation cache
    res = _run("--repo", str(repo), "--port", "0", "--poll-s", "0", "--activation-cache-bytes", absurd)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "refusing to start" in res.stderr
    assert "--activation-cache-bytes" in res.stderr and "--allow-overcommit" in res.stderr
    assert "GiB" in res.stderr


def test_absurd_hot_tier_is_refused_with_redis_features(repo: Path) -> None:
    # checked before anything connects: no Redis needs to run at this URL
    res = _run("--repo", str(repo), "--port", "0", "--features", "redis://127.0.0.1:1/0", "--hot-bytes", str(1 << 60))
    assert res.returncode == 2, res.stderr[-2000:]
    assert "feature hot tier" in res.stderr


def _serve_until_ready(repo: Path, tmp_path: Path, *extra: str) -> tuple[int, str]:
    """Start `gnnserve serve`, wait for its ready file, stop it; (exit code or 0 if it became ready, stderr)."""
    ready = tmp_path / "ready"
    log = tmp_path / "serve.log"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with open(log, "w") as err:
        proc = subprocess.Popen([*GNNSERVE, "serve", "--repo", str(repo), "--port", "0", "--poll-s", "0",
                                 "--ready-file", str(ready), *extra], stdout=subprocess.DEVNULL, stderr=err,
                                env=env, cwd=REPO_ROOT)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None and not ready.exists():
                time.sleep(0.2)
            code = proc.poll()
            became_ready = ready.exists()
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    text = log.read_text()
    return (0 if became_ready else (code if code is not None else -1)), text


def test_allow_overcommit_starts_anyway(repo: Path, tmp_path: Path) -> None:
    code, text = _serve_until_ready(repo, tmp_path, "--activation-cache-bytes", str(1 << 60), "--allow-overcommit")
    assert code == 0, text[-3000:]
    assert "refusing" not in text


def test_default_budgets_start(repo: Path, tmp_path: Path) -> None:
    code, text = _serve_until_ready(repo, tmp_path)
    assert code == 0, text[-3000:]


def _args(repo: Path, **kw) -> argparse.Namespace:
    base = dict(repo=str(repo), graph=None, features="memory", hot_bytes=0, projection_cache_bytes=2 << 30,
                activation_cache_bytes=256 << 20, induced_table_bytes=1 << 30, graph_cache_bytes=64 << 20)
    base.update(kw)
    return argparse.Namespace(**base)


def test_estimate_terms(repo: Path) -> None:
    conf = json.loads((repo / "m" / "1" / "config.json").read_text())
    n, e, f = (conf["dataset"][k] for k in ("num_nodes", "num_edges", "num_features"))
    terms = dict((what.split(" (")[0].split(" of ")[0], b) for what, b in estimate(_args(repo)).items)
    assert terms["graph"] == (n + 1) * 8 + e * 4
    assert terms["features"] == n * f * 4
    assert terms["projection table"] == n * conf["model"]["hidden"] * 4
    assert terms["activation cache budget"] == 256 << 20
    # a projection budget smaller than the table: the cache stays off, nothing counted
    small = estimate(_args(repo, projection_cache_bytes=100))
    assert not any(what.startswith("projection") for what, _ in small.items)
    # stateless: no local graph or features; the row cache and hot tier count instead
    st = estimate(_args(repo, graph="redis://x", hot_bytes=5 << 20))
    names = [what for what, _ in st.items]
    assert not any(w.startswith(("graph of", "features of")) for w in names)
    assert any(w.startswith("graph row cache") for w in names) and any(w.startswith("feature hot tier") for w in names)
    assert [b for w, b in st.items if w.startswith("graph degree chunks")] == [12 * n]
    assert [b for w, b in st.items if w.startswith("PPR list reach sets")] == [(32 << 20) + (16 << 20)]


def test_estimate_counts_a_ppr_models_push_state(repo: Path, tmp_path: Path) -> None:
    """A shaDow model served from a local graph: its top-K index and the dense push state a new node's push takes
    (kernels.ppr_push._DenseScratch of one worker, N + 1 nodes x 40 bytes, per parallel worker of ppr_new_nodes;
    none past DENSE_NEW_NODE_MAX)."""
    from kernels.ppr_push import DENSE_NEW_NODE_MAX, NEW_NODE_PARALLEL_BYTES, new_node_workers
    from kernels.threads import numba_threads

    conf = json.loads((repo / "m" / "1" / "config.json").read_text())
    n = conf["dataset"]["num_nodes"]
    for name, nodes in (("s", n), ("big", DENSE_NEW_NODE_MAX)):
        d = tmp_path / name / "repo" / "s" / "1"
        d.mkdir(parents=True)
        ds = dict(conf["dataset"], num_nodes=nodes, graph_fingerprint=f"fp-{name}")
        d.joinpath("config.json").write_text(json.dumps({"dataset": ds, "extractor": "ppr",
                                                          "ppr": {"topk": 16, "eps": 1e-4},
                                                          "model": {"hidden": 8}}))
        items = estimate(_args(d.parent.parent)).items
        state = [b for w, b in items if w.startswith("PPR push state for new nodes")]
        assert any(w.startswith("PPR top-16 index") for w, _ in items)
        workers = new_node_workers(nodes, 1 << 30)
        assert 1 <= workers <= numba_threads() and (workers - 1) * 40 * (nodes + 1) <= NEW_NODE_PARALLEL_BYTES
        assert state == ([workers * 40 * (nodes + 1)] if nodes + 1 <= DENSE_NEW_NODE_MAX else [])


def _big_repo(tmp_path: Path, repo: Path, nodes: int, plain: int = 1) -> Path:
    """A repository of config.json files only (the budgets read nothing else): ``plain`` GCNs on one graph of
    ``nodes`` nodes, the tiny checkpoint's sizes otherwise."""
    conf = json.loads((repo / "m" / "1" / "config.json").read_text())
    root = tmp_path / f"big{nodes}"
    for i in range(plain):
        d = root / f"g{i}" / "1"
        d.mkdir(parents=True)
        d.joinpath("config.json").write_text(json.dumps(dict(conf, dataset=dict(conf["dataset"], num_nodes=nodes))))
    return root


def test_auto_budgets_fit_the_tables_of_a_large_graph_when_memory_allows(repo: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` (the default): a 10 M-node GCN's projection and first-layer tables (2.56 GB and 2.57 GB, above the
    fixed 2 GiB and 256 MiB) are kept on a machine with room for them and the rest, never on one without; explicit
    budgets are left alone; a small graph keeps the fixed defaults."""
    import serve.memory_budget as mb

    conf = json.loads((repo / "m" / "1" / "config.json").read_text())
    hidden = conf["model"]["hidden"]
    n = 10_000_000
    big = _big_repo(tmp_path, repo, n)
    for mem, fitted in ((256 << 30, True), (6 << 30, False)):
        monkeypatch.setattr(mb, "machine_memory_bytes", lambda m=mem: m)
        args = _args(big, projection_cache_bytes="auto", activation_cache_bytes="auto")
        lines = mb.resolve_auto_budgets(args)
        assert len(lines) == 2 and all(" auto: " in line for line in lines)
        if fitted:  # with room for n / 16 nodes more: a live graph's updates add nodes
            assert args.projection_cache_bytes == n * hidden * 4 + n * hidden * 4 // mb.AUTO_GROWTH
            assert args.activation_cache_bytes == n * (4 * hidden + 1) + n * (4 * hidden + 1) // mb.AUTO_GROWTH
            grown = n + n // 20  # a table of 5% more nodes than the checkpoint's still fits the budget
            assert grown * (4 * hidden + 1) <= args.activation_cache_bytes and grown * hidden * 4 <= \
                args.projection_cache_bytes
            assert any(w.startswith("projection table") for w, _ in mb.estimate(args).items)
        else:
            assert (args.projection_cache_bytes, args.activation_cache_bytes) == (2 << 30, 256 << 20)
            assert "would not fit" in lines[0]
    # two processes hold two copies: what fits once need not fit twice
    monkeypatch.setattr(mb, "machine_memory_bytes", lambda: 10 << 30)
    one = _args(big, projection_cache_bytes="auto", activation_cache_bytes="auto")
    two = _args(big, projection_cache_bytes="auto", activation_cache_bytes="auto", processes=2)
    mb.resolve_auto_budgets(one), mb.resolve_auto_budgets(two)
    assert one.projection_cache_bytes == n * hidden * 4 + n * hidden * 4 // mb.AUTO_GROWTH
    assert two.projection_cache_bytes == 2 << 30
    assert one.activation_cache_bytes == 256 << 20  # the projection table took the room
    explicit = _args(big, projection_cache_bytes=123, activation_cache_bytes=0)
    assert mb.resolve_auto_budgets(explicit) == [] and (explicit.projection_cache_bytes,
                                                        explicit.activation_cache_bytes) == (123, 0)
    small = _args(repo, projection_cache_bytes="auto", activation_cache_bytes="auto")
    mb.resolve_auto_budgets(small)
    assert (small.projection_cache_bytes, small.activation_cache_bytes) == (2 << 30, 256 << 20)


def test_a_budget_that_is_neither_bytes_nor_auto_is_refused(repo: Path) -> None:
    res = _run("--repo", str(repo), "--port", "0", "--projection-cache-bytes", "lots")
    assert res.returncode == 2 and "neither a number of bytes nor 'auto'" in res.stderr
    res = _run("--repo", str(repo), "--port", "0", "--activation-cache-bytes", "-5")
    assert res.returncode == 2 and "--activation-cache-bytes must be >= 0" in res.stderr


def test_a_checkpoint_is_timed_with_the_budgets_a_server_of_it_takes(repo: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``gnnserve train``'s knob re-timing sizes its caches as ``auto`` serves the checkpoint: a 10 M-node GCN's
    tables (with room to grow) on a machine with room for them, the fixed defaults on one without, and on a small
    graph (a 2 M-node GCN's knob table was timed without the first-layer table its server holds: a new user's
    report)."""
    import serve.memory_budget as mb

    conf = json.loads((repo / "m" / "1" / "config.json").read_text())
    hidden = conf["model"]["hidden"]
    n = 10_000_000
    big = _big_repo(tmp_path, repo, n)
    ckpt = next(p.parent for p in big.glob("*/*/config.json"))
    monkeypatch.setattr(mb, "machine_memory_bytes", lambda: 256 << 30)
    proj, act = mb.checkpoint_budgets(ckpt)
    assert act == n * (4 * hidden + 1) + n * (4 * hidden + 1) // mb.AUTO_GROWTH
    assert proj == n * hidden * 4 + n * hidden * 4 // mb.AUTO_GROWTH
    monkeypatch.setattr(mb, "machine_memory_bytes", lambda: 6 << 30)
    assert mb.checkpoint_budgets(ckpt) == (2 << 30, 256 << 20)
    monkeypatch.setattr(mb, "machine_memory_bytes", lambda: 256 << 30)
    assert mb.checkpoint_budgets(repo / "m" / "1") == (2 << 30, 256 << 20)
