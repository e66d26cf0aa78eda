"""The one-launch kernels under NVIDIA compute-sanitizer, on a GPU machine (``bash benchmarks/gpu_session.sh
sanitize`` runs this under memcheck, racecheck and synccheck): what the CPU host emulations cannot see --
shared-memory races between threads of one phase, out-of-bounds reads, divergent barriers.

Small batches through a shaDow model's whole-batch kernel (kernels.shadow_block: GCN and GraphSAGE, a
GraphSAGE transform in passes of a few rows, 256 hidden features at a budget of 64, beyond 48 KiB of shared
memory) and a plain model's last layer (kernels.resident_head), at the exact and a sampled width; and the
ES-SpMM kernel itself (``kernels.sampled_spmm``: split hub rows, the 128-bit and scalar instances, bfloat16)
against its torch twin. It exits 0 once every call ran and matched; the sanitizer's exit status
(``--error-exitcode``) reports its findings. Not a pytest module (no ``test_`` prefix): it runs under the
sanitizer as a plain script.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from kernels import sampled_spmm, shadow_block
from kernels.spmm import sampled_spmm_torch
from tests.test_resident import _shadow_setup
from tests.test_resident_head import _assert_same, _resident
from tests.test_resident_head import _spec as _plain_spec
from tests.test_shadow_block import _spec as _shadow_spec
from tests.test_shadow_block import assert_same
from tests.test_spmm_cuda import features, hub_graph


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    t = np.arange(0, 600, 97)
    for backbone, pool, layers, hidden, topk, small in [("gcn", "mean", 2, 8, 24, False),
                                                        ("sage", "mean+max", 3, 37, 24, False),
                                                        ("sage", "max", 2, 16, 24, True),
                                                        ("gcn", "max", 2, 256, 64, False)]:
        limit = shadow_block.SHARED_LIMIT
        if small:  # GraphSAGE's transform in passes of SCRATCH_ROWS rows
            shadow_block.SHARED_LIMIT = 1024
        try:
            _, _, _, _, res = _shadow_setup(backbone, pool, layers, True, device="cuda", hidden=hidden, classes=5,
                                            topk=topk, fused=True)
            for width in (0, 3):
                got = res.unpack_host(res.block.answer(t, width, topk, True), len(t), True)
                assert_same(got, _shadow_spec(res, t, width, topk, True), f"{backbone} S={width}")
        finally:
            shadow_block.SHARED_LIMIT = limit
        print(f"shadow_block {backbone} {pool} L={layers} H={hidden} K={topk}: ok", flush=True)
    for arch in ("gcn", "sage"):
        g, _, r = _resident(arch, 5, True, "fastrand", 37, 7)
        nodes = np.array([0, 3, g.num_nodes - 1, 17, 400])
        for width in (0, 8):
            assert r.has_table(width)
            _assert_same(r.answer(nodes, width, True), _plain_spec(r, nodes, width, True), width)
        print(f"resident_head {arch}: ok", flush=True)
    g = hub_graph(2, weighted=True)  # hubs far above the split threshold, many short rows
    for f, dtype in ((64, torch.float32), (30, torch.float32), (64, torch.bfloat16)):
        x = torch.from_numpy(features(g.num_nodes, f, 2)).to("cuda", dtype)
        for width, aggregator in ((0, "gcn"), (16, "mean"), (0, "sum")):
            got = sampled_spmm(g, x, width, "fastrand", aggregator).float().cpu()
            want = sampled_spmm_torch(g, x.float().cpu().double(), width, "fastrand", aggregator).float()
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-4  # relative to the output's scale (hub sums are large)
            assert torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max())), (f, dtype, width,
                                                                                             aggregator)
        print(f"es_spmm F={f} {dtype}: ok", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
