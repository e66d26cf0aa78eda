"""What ``benchmarks/device_split.py`` and ``benchmarks/one_node.py`` share: model runtimes loaded the way
the server loads them, one ``BackgroundServer`` per variant of :class:`serve.runtime.RuntimeOptions`, and
a batch handed to ``ModelRuntime.process`` directly (no gRPC on the timed path). And what
``benchmarks/first_start.py`` and ``benchmarks/cold_start.py`` share: a ``gnnserve serve`` subprocess timed
to its ready file (:func:`server_process`)."""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def server_process(serve_args: list[str], *, env: dict[str, str], log_path: Path,
                   timeout_s: float = 600.0) -> Iterator[float]:
    """``gnnserve serve SERVE_ARGS --ready-file F`` in a subprocess of this interpreter (run from the
    repository's root, its output to ``log_path``): yields the seconds from the process's start to its ready
    file, then terminates it (killed after 60 s). A ``RuntimeError`` with the log's tail where it exits or
    is not ready within ``timeout_s``."""
    ready = log_path.with_name(log_path.name + ".ready")
    ready.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "serve.cli", "serve", *serve_args, "--ready-file", str(ready)]
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        while not (ready.exists() and ready.read_text().strip()):
            if proc.poll() is not None or time.perf_counter() - t0 > timeout_s:
                why = f"exit {proc.returncode}" if proc.returncode is not None else f"not ready in {timeout_s:.0f} s"
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the server did not start ({why}):\n{tail}")
            time.sleep(0.02)
        yield time.perf_counter() - t0
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def parser(doc: str, variants: dict[str, dict[str, Any]], default_variants: str, batches: str,
           sets: int) -> argparse.ArgumentParser:
    """The arguments both scripts take: the repository, datasets, models, batch sizes, batches per round,
    rounds and variants (a comma list of ``variants``' names)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, help="a model repository (checkpoint directories)")
    ap.add_argument("--data", action="append", default=[], help="dataset path(s), as for gnnserve serve --data")
    ap.add_argument("--models", required=True, help="comma-separated model names in the repository")
    ap.add_argument("--batches", default=batches, help="targets per batch")
    ap.add_argument("--sets", type=int, default=sets, help="batches per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default=default_variants, help="comma-separated: " + ", ".join(variants))
    return ap


def start_variants(ap: argparse.ArgumentParser, variants: dict[str, dict[str, Any]], wanted: str, repo: str,
                   data: list[str]) -> dict[str, Any]:
    """A started ``BackgroundServer`` per name in the comma list ``wanted`` (``ap.error`` on an unknown
    one); the variants on a CUDA device are left out where torch sees no GPU."""
    import torch

    from serve.runtime import RuntimeOptions
    from serve.server import BackgroundServer, ServerConfig

    names = [v for v in wanted.split(",") if v]
    for v in names:
        if v not in variants:
            ap.error(f"unknown variant {v!r}")
    if not torch.cuda.is_available():
        names = [v for v in names if variants[v]["device"] == "cpu"]
    return {v: BackgroundServer(ServerConfig(repo=repo, port=0, poll_s=0, data_paths=data,
                                             runtime=RuntimeOptions(**variants[v]))).start() for v in names}


class _Pending:
    """The future of a batch item nobody waits on (``process`` only asks whether it is done)."""

    def done(self) -> bool:
        return False


def process(rt: Any, nodes: np.ndarray, width: int, budget: int) -> Any:
    """``rt.process`` on one batch of ``nodes`` at a width and PPR budget (probabilities, no embeddings):
    its :class:`serve.runtime.PredictResult`, or the batch's error raised."""
    from serve.batcher import WorkItem
    from serve.validation import PredictCall

    call = PredictCall("bench", nodes, [], width, budget, "default", 0.0, True, False)
    res = rt.process([WorkItem(call, len(nodes), None, None, time.monotonic(), _Pending())])[0]
    if isinstance(res, BaseException):
        raise res
    return res
