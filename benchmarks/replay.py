"""A start's replay of the update log: how long a server takes to come back after ``--updates`` logged updates.

One ``gnnserve serve`` of this tree writes the log: ``--updates`` updates of ``--edges`` random absent edges each
(one update per call, so one logged version per update), sent to ``--model``; then each model of the repository
answers ``--probe`` random nodes (the answers to come back to). Then, ``--rounds`` times and alternating the order,
each side (this tree; with ``--base``, also a git worktree of that revision) starts on a copy of that log and on
an empty one; reported: the seconds to serving with the log and without it, their difference (the replay), and
whether the answers after the replay equal those before the restart, bit for bit, and (this tree's servers log
it) the replay's own seconds. Compaction stays off on both sides (``--compact-log-bytes 0``; ``--compact-replay-s
0`` on this tree), so every start replays the whole log.

``--compact-replay-s S`` instead lets the writing server compact its log as a server does while serving (it
waits for the log line, ``--compact-idle-s 5``; the snapshot's PPR lists are saved into ``REPO/_ppr``, the
only thing written into the repository): the starts then load that snapshot and replay nothing.

    python benchmarks/replay.py --repo REPO --data ../shared/data/amazon_computers.npz --model gcn --base 8fb0985

``--json PATH`` writes every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))

from clients import GnnClient  # noqa: E402
from tests.serving import ServerProcess  # noqa: E402


def absent_edges(graph: Any, rng: np.random.Generator, count: int, taken: set[tuple[int, int]]) -> list[list[int]]:
    """``count`` node pairs that are neither edges of ``graph`` nor in ``taken`` (added to it)."""
    out: list[list[int]] = []
    n = graph.num_nodes
    while len(out) < count:
        u, v = sorted(int(x) for x in rng.integers(0, n, 2))
        if u == v or (u, v) in taken or np.any(graph.indices[graph.indptr[u]:graph.indptr[u + 1]] == v):
            continue
        taken.add((u, v))
        out.append([u, v])
    return out


def serve_args(logdir: Path, data: list[str], new_side: bool, compact_s: float = 0.0) -> list[str]:
    out = ["--update-log-dir", str(logdir), "--compact-log-bytes", "0"]
    for d in data:
        out += ["--data", d]
    if compact_s > 0:
        return [*out, "--compact-replay-s", str(compact_s), "--compact-idle-s", "5"]
    return out + (["--compact-replay-s", "0"] if new_side else [])


def replay_seconds(log_text: str) -> float | None:
    """The replay's seconds as the server logged them (``N logged versions replayed in X s``; not before 2026-11-29)."""
    m = re.search(r"logged versions replayed in ([0-9.]+) s", log_text)
    return float(m.group(1)) if m else None


def wait_for_compaction(srv: ServerProcess, timeout: float = 3600) -> float:
    """Seconds the writing server's compaction took (its log line), waiting for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"compacted at version \d+ into .* in ([0-9.]+) s", srv.log_path.read_text(errors="replace"))
        if m:
            return float(m.group(1))
        time.sleep(1)
    raise TimeoutError(f"no compaction within {timeout} s:\n{srv.log()}")


def probe(address: str, models: list[str], nodes: np.ndarray) -> dict[str, tuple[np.ndarray, int]]:
    with GnnClient(address, timeout=600) as c:
        out = {}
        for m in models:
            r = c.predict(m, nodes)
            out[m] = (np.asarray(r.probabilities), int(r.graph_version))
        return out


def timed_start(repo: Path, args: list[str], tree: Path) -> tuple[ServerProcess, float]:
    srv = ServerProcess(repo, *args, tree=tree)
    t0 = time.perf_counter()
    srv.start(timeout=3600)
    return srv, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", required=True, type=Path, help="a model repository (left as it is: the log goes to a "
                                                             "temp dir)")
    ap.add_argument("--data", action="append", default=[], help="dataset path(s), as for gnnserve serve --data")
    ap.add_argument("--graph", default=None, help="the dataset whose graph the edges are drawn from, as "
                                                  "kernels.datasets.load_dataset takes it (default: the first --data)")
    ap.add_argument("--model", required=True, help="the model the updates are sent to")
    ap.add_argument("--updates", type=int, default=100, help="logged updates (default: %(default)s)")
    ap.add_argument("--edges", type=int, default=1, help="added edges per update (default: %(default)s)")
    ap.add_argument("--probe", type=int, default=256, help="nodes each model answers (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="starts per side and log (default: %(default)s)")
    ap.add_argument("--base", default=None, help="a git revision to compare with (its worktree)")
    ap.add_argument("--base-tree", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--compact-replay-s", type=float, default=0.0,
                    help="let the writing server compact its log once idle (see above; default: off)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if not args.data and not args.graph:
        ap.error("--graph (or --data) is needed: the edges are drawn from that graph")
    if min(args.updates, args.edges, args.probe, args.rounds) < 1:
        ap.error("--updates, --edges, --probe and --rounds must be >= 1")

    from ab import base_side

    from kernels.datasets import load_dataset

    graph = load_dataset(args.graph or args.data[0]).graph
    rng = np.random.default_rng(args.seed)
    nodes = rng.choice(graph.num_nodes, min(args.probe, graph.num_nodes), replace=False).astype(np.int64)
    taken: set[tuple[int, int]] = set()
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gnnserve-replay-")))
        written, empty = work / "log", work / "empty"
        empty.mkdir()
        srv = stack.enter_context(ServerProcess(args.repo, *serve_args(written, args.data, True,
                                                                       args.compact_replay_s)))
        with GnnClient(srv.address, timeout=600) as c:
            models = [m.name for m in c.list_models()]
            t0 = time.perf_counter()
            for i in range(args.updates):
                c.update_graph(args.model, add_edges=absent_edges(graph, rng, args.edges, taken))
                if (i + 1) % max(1, args.updates // 10) == 0:
                    print(f"  {i + 1} / {args.updates} updates sent ({time.perf_counter() - t0:.1f} s)", flush=True)
            write_s = time.perf_counter() - t0
        before = probe(srv.address, models, nodes)
        compact_s = wait_for_compaction(srv) if args.compact_replay_s > 0 else None
        srv.kill()
        sides = [("new", ROOT)]
        if args.base or args.base_tree:
            tree, rev = stack.enter_context(base_side(args))
            sides.append((f"base {rev}", tree))
        for name, tree in sides:  # a first start of each tree compiles its kernels (numba's cache beside them),
            warm = work / "warm"  # the update path's too: it replays the log
            shutil.copytree(written, warm)
            timed_start(args.repo, serve_args(warm, args.data, name == "new"), tree)[0].kill()
            shutil.rmtree(warm)
        for r in range(args.rounds):
            for name, tree in sides if r % 2 == 0 else sides[::-1]:
                logdir = work / f"log-{r}-{name.split()[0]}"
                shutil.copytree(written, logdir)
                for which, d in (("log", logdir), ("empty", empty)):
                    s, secs = timed_start(args.repo, serve_args(d, args.data, name == "new"), tree)
                    try:
                        got = probe(s.address, models, nodes) if which == "log" else None
                    finally:
                        s.kill()
                    row: dict[str, Any] = {"side": name, "round": r, "log": which, "start_s": secs,
                                           "replay_s": replay_seconds(s.log_path.read_text(errors="replace"))}
                    if got is not None:
                        row["equal"] = all(np.array_equal(got[m][0], before[m][0]) and got[m][1] == before[m][1]
                                           for m in models)
                        row["max_abs_diff"] = max(float(np.abs(got[m][0] - before[m][0]).max()) for m in models)
                    rows.append(row)
                    print(f"  round {r} {name}: start with {which} log {secs:.1f} s", flush=True)
                shutil.rmtree(logdir, ignore_errors=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n### Replay of {args.updates} logged updates of {args.edges} edge(s) ({', '.join(models)}; "
          f"N = {graph.num_nodes:,})\n")
    print(f"{when}, {platform.machine()} {platform.node()}; command: python benchmarks/replay.py "
          + " ".join(argv if argv is not None else sys.argv[1:]) + f"\n\nWriting the log: {write_s:.1f} s"
          + (f"; the writer's compaction once idle: {compact_s:.1f} s" if compact_s is not None else "") + ".\n")
    print("| side | round | start with the log (s) | start, empty log (s) | replay (difference, s) | replay "
          "(server's log line, s) | answers equal to before the restart |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, _ in sides:
        for r in range(args.rounds):
            w = next(x for x in rows if x["side"] == name and x["round"] == r and x["log"] == "log")
            e = next(x for x in rows if x["side"] == name and x["round"] == r and x["log"] == "empty")
            eq = "yes" if w["equal"] else f"no (max diff {w['max_abs_diff']:.2e})"
            own = "-" if w["replay_s"] is None else f"{w['replay_s']:.2f}"
            print(f"| {name} | {r} | {w['start_s']:.1f} | {e['start_s']:.1f} | {w['start_s'] - e['start_s']:.1f} | "
                  f"{own} | {eq} |")
    if args.json:
        args.json.write_text(json.dumps({"when": when, "argv": argv or sys.argv[1:], "write_s": write_s,
                                         "compact_s": compact_s, "rows": rows}, indent=1))
    if not all(x.get("equal", True) for x in rows):
        raise SystemExit("answers after a replay differ from those before the restart")


if __name__ == "__main__":
    main()
