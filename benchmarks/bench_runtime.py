"""What ``benchmarks/device_split.py`` and ``benchmarks/one_node.py`` share: model runtimes loaded the way
the server loads them, one ``BackgroundServer`` per variant of :class:`serve.runtime.RuntimeOptions`, and
a batch handed to ``ModelRuntime.process`` directly (no gRPC on the timed path)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np


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
