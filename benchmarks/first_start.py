"""A CPU server's start on an empty and on a warm numba cache: what a first start on a machine costs.

For each repository, round by round: ``gnnserve serve --repo REPO --read-only`` (and ``--serve-args``) from the
process's start to its ready file with ``NUMBA_CACHE_DIR`` a new directory (a fresh machine, or an image whose package directory
cannot be written), then again on the cache that start filled. The server's log names each numba
compilation with its time (``kernels.compile_log``) and what it compiled in parallel processes first
(``kernels.precompile``); the table sums them, and the slowest kernels of the last cold start follow.

    python benchmarks/serve.py --datasets cora --models gcn,shadow-gcn --cache-dir DIR --train-only
    python benchmarks/first_start.py --repo DIR/cora/repo --rounds 2
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # bench_runtime (appended: benchmarks/serve.py is no package)

import bench_runtime

COMPILED = re.compile(r"numba: compiled (.+?) in ([0-9.]+) s$", re.M)
#: kernels.precompile's line: the signatures compiled in parallel processes before the models loaded
PRECOMPILED = re.compile(r"precompiled (\d+) kernel signatures in ([0-9.]+) s in (\d+) processes")


def start(repo: str, cache: str, timeout_s: float, extra: list[str]) -> tuple[float, list[tuple[str, float]], str]:
    """Seconds from the server process's start to its ready file, the compilations its log names, and what it
    precompiled in parallel (``signatures / s / processes``, or ``-``)."""
    with tempfile.TemporaryDirectory() as d:
        log_path = Path(d) / "server.log"
        with bench_runtime.server_process(["--repo", repo, "--port", "0", "--read-only", "--log-level", "INFO", *extra],
                                          env=dict(os.environ, NUMBA_CACHE_DIR=cache), log_path=log_path,
                                          timeout_s=timeout_s) as took:
            pass
        text = log_path.read_text(errors="replace")
    pre = PRECOMPILED.search(text)
    said = f"{pre.group(1)} / {float(pre.group(2)):.1f} / {pre.group(3)}" if pre else "-"
    return took, [(m.group(1), float(m.group(2))) for m in COMPILED.finditer(text)], said


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", action="append", required=True, help="a model repository (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a start may take")
    ap.add_argument("--top", type=int, default=10, help="the slowest compilations listed")
    ap.add_argument("--serve-args", default="", help="more `gnnserve serve` arguments, e.g. '--precompile-jobs 0'")
    args = ap.parse_args(argv)
    print("## A server's first start on a machine (`benchmarks/first_start.py`)\n")
    print(f"`python benchmarks/first_start.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n")
    print(f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs; seconds from the server "
          "process's start to its ready file\n")
    print("| repository | round | empty numba cache s | precompiled first (signatures / s / processes) | the server's "
          "own compiling s (kernels) | warm cache s | compiled when warm |")
    print("|---|---|---|---|---|---|---|")
    extra = args.serve_args.split()
    last: list[tuple[str, float]] = []
    for repo in args.repo:
        for rnd in range(1, args.rounds + 1):
            cache = tempfile.mkdtemp(prefix="gnnserve-numba-")
            try:
                cold, compiled, pre = start(repo, cache, args.timeout, extra)
                warm, again, _ = start(repo, cache, args.timeout, extra)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            last = compiled
            print(f"| {repo} | {rnd} | {cold:.1f} | {pre} | {sum(t for _, t in compiled):.1f} ({len(compiled)}) | {warm:.1f} "
                  f"| {len(again)} |", flush=True)
    if last:
        print("\nThe slowest compilations of the last cold start:\n\n| kernel | s |\n|---|---|")
        for name, t in sorted(last, key=lambda c: -c[1])[: args.top]:
            print(f"| `{name}` | {t:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
