r"""ONNX export of a checkpoint: one batch of subgraphs in, logits and probabilities out.

``gnnserve export-onnx CHECKPOINT [--out PATH] [--triton-repo DIR] [--name NAME]`` (also
``python -m models.export_onnx``) writes an ONNX model (opset 18, dynamic sizes) with exact
aggregation written as gathers and ``scatter_add``/``scatter_reduce`` over an explicit edge list
(no sparse tensors, no sampling: ONNX has no ES-SpMM kernel), and optionally a Triton Inference
Server model repository ``DIR/NAME/config.pbtxt`` + ``DIR/NAME/1/model.onnx``.

Inputs (``R`` rows of the block-diagonal batch, ``E`` edges, ``B`` targets; all sizes dynamic):

================  =======  ===========  ==========================================================
name              dtype    shape        meaning
================  =======  ===========  ==========================================================
``x``             float32  ``[R, F]``   raw features of every row (normalisation is inside)
``edge_index``    int64    ``[2, E]``   local edges ``(i, j)``: row ``i`` aggregates row ``j``
                                        (``SubgraphBatch.graph.edge_index()``)
``norm_degrees``  float32  ``[R]``      GCN only: full-graph ``D = 1 + deg`` of each row's node
                                        (``model.norm_degrees_for(graph, batch.node_ids)``)
``target_pos``    int64    ``[B]``      row of each target (``SubgraphBatch.target_rows``)
``batch``         int64    ``[R]``      shaDow with pooling only: subgraph id of each row
``edge_weight``   float32  ``[E]``      only when exported with ``weighted=True``
================  =======  ===========  ==========================================================

Outputs: ``logits`` float32 ``[B, C]`` and ``probabilities`` float32 ``[B, C]`` (softmax).

The aggregations are those of :mod:`kernels.spmm` at exact width with edge weights ``w``
(1 unless ``edge_weight`` is given), ``d_i`` = number of edges of row ``i``:

.. math::

    \mathrm{gcn}: \; o_i = \frac{h_i}{D_i} + \sum_{(i,j)} \frac{w_{ij} h_j}{\sqrt{D_i D_j}}, \qquad
    \mathrm{mean}: \; o_i = \frac{1}{\max(d_i, 1)} \sum_{(i,j)} w_{ij} h_j

with ``D`` the ``norm_degrees`` input for plain GCN and ``1 + sum_j w_ij`` inside the batch for
shaDow-GCN (each subgraph normalised on its own, as trained).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .base import GNNModel
from .checkpoint import CheckpointError, load_checkpoint
from .shadow import ShadowGNN

__all__ = ["ExportCheckError", "OnnxBatchModel", "export_onnx", "input_spec", "main", "output_spec", "write_triton_config"]

log = logging.getLogger(__name__)

OPSET = 18


def _scatter_sum(src: Tensor, index: Tensor, num: Tensor | int) -> Tensor:
    """``out[index[e]] += src[e]`` -> ``[num, ...]`` (ONNX ScatterElements with reduction "add")."""
    if src.dim() == 1:
        return torch.zeros(num, dtype=src.dtype, device=src.device).scatter_add(0, index, src)
    idx = index.unsqueeze(1).expand(-1, src.shape[1])
    return torch.zeros(num, src.shape[1], dtype=src.dtype, device=src.device).scatter_add(0, idx, src)


def _gcn_agg(h: Tensor, row: Tensor, col: Tensor, w: Tensor, deg_hat: Tensor) -> Tensor:
    dinv = deg_hat.clamp(min=1e-12).rsqrt()
    coef = (w * dinv[row] * dinv[col]).unsqueeze(1)
    out = _scatter_sum(h[col] * coef, row, h.shape[0])
    return out + h * (dinv * dinv).unsqueeze(1)


def _mean_agg(h: Tensor, row: Tensor, col: Tensor, w: Tensor) -> Tensor:
    cnt = _scatter_sum(torch.ones_like(w), row, h.shape[0])
    out = _scatter_sum(h[col] * w.unsqueeze(1), row, h.shape[0])
    return out / cnt.clamp(min=1.0).unsqueeze(1)


class OnnxBatchModel(nn.Module):
    """Exportable twin of a model's ``forward_batch`` on explicit edge lists (module docstring).

    It holds the trained model and uses its parameters; only the aggregation is rewritten.
    ``forward(*inputs)`` takes the inputs of :func:`input_spec` in that order.
    """

    def __init__(self, model: GNNModel, weighted: bool = False) -> None:
        super().__init__()
        self.model = model.eval()
        self.weighted = bool(weighted)
        self.arch = model.arch
        self.shadow = isinstance(model, ShadowGNN)
        self.backbone = model.backbone if self.shadow else model.arch
        self.uses_batch = self.shadow and bool(model.pools)
        self.uses_norm_degrees = model.arch == "gcn"

    def input_names(self) -> list[str]:
        names = ["x", "edge_index"]
        if self.uses_norm_degrees:
            names.append("norm_degrees")
        names.append("target_pos")
        if self.uses_batch:
            names.append("batch")
        if self.weighted:
            names.append("edge_weight")
        return names

    def _conv(self, i: int, conv: nn.Module, h: Tensor, row: Tensor, col: Tensor, w: Tensor,
              deg_hat: Tensor | None) -> Tensor:
        t = conv.transform(h) if i > 0 else h  # layer 0 receives the projection
        if self.backbone == "gcn":
            assert deg_hat is not None
            out = _gcn_agg(t, row, col, w, deg_hat)
        else:
            o = conv.out_channels
            out = t[:, :o] + _mean_agg(t[:, o:], row, col, w)
        return out + conv.bias if conv.bias is not None else out

    def forward(self, *inputs: Tensor) -> tuple[Tensor, Tensor]:
        named = dict(zip(self.input_names(), inputs, strict=True))
        x, edge_index, target_pos = named["x"], named["edge_index"], named["target_pos"]
        row, col = edge_index[0], edge_index[1]
        w = named["edge_weight"] if self.weighted else torch.ones(row.shape[0], dtype=x.dtype, device=x.device)
        m = self.model
        deg_hat = None
        if self.backbone == "gcn":
            if self.uses_norm_degrees:
                deg_hat = named["norm_degrees"]
            else:
                deg_hat = _scatter_sum(w, row, x.shape[0]) + 1.0
        h = m.project(x)
        last = len(m.convs) - 1
        for i, conv in enumerate(m.convs):
            h = self._conv(i, conv, h, row, col, w, deg_hat)
            if self.shadow or i < last:
                h = torch.relu(h)
        if self.shadow:
            parts = [h[target_pos]]
            if self.uses_batch:
                seg = named["batch"]
                nb = target_pos.shape[0]
                for kind in m.pools:
                    if kind == "mean":
                        s = _scatter_sum(h, seg, nb)
                        c = _scatter_sum(torch.ones_like(h[:, 0]), seg, nb)
                        parts.append(s / c.clamp(min=1.0).unsqueeze(1))
                    else:
                        # h >= 0 after ReLU, so max over the rows with a zero start is the row max
                        idx = seg.unsqueeze(1).expand(-1, h.shape[1])
                        parts.append(torch.zeros(nb, h.shape[1], dtype=h.dtype, device=h.device).scatter_reduce(
                            0, idx, h, "amax", include_self=True))
            r = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
            logits = m.classifier(r)
        else:
            logits = h[target_pos]
        return logits, torch.softmax(logits, dim=1)


def input_spec(wrapper: OnnxBatchModel) -> list[tuple[str, str, list[int]]]:
    """``(name, dtype, dims)`` of every input, ``-1`` = dynamic (Triton's notation)."""
    f = wrapper.model.in_dim
    dims = {
        "x": ("TYPE_FP32", [-1, f]),
        "edge_index": ("TYPE_INT64", [2, -1]),
        "norm_degrees": ("TYPE_FP32", [-1]),
        "target_pos": ("TYPE_INT64", [-1]),
        "batch": ("TYPE_INT64", [-1]),
        "edge_weight": ("TYPE_FP32", [-1]),
    }
    return [(n, *dims[n]) for n in wrapper.input_names()]


def output_spec(wrapper: OnnxBatchModel) -> list[tuple[str, str, list[int]]]:
    c = wrapper.model.num_classes
    return [("logits", "TYPE_FP32", [-1, c]), ("probabilities", "TYPE_FP32", [-1, c])]


def _example_inputs(wrapper: OnnxBatchModel) -> tuple[Tensor, ...]:
    """A small two-subgraph batch to trace with (sizes distinct so no dimension is specialised)."""
    gen = torch.Generator().manual_seed(0)
    r, e = 7, 10
    ex = {
        "x": torch.rand(r, wrapper.model.in_dim, generator=gen),
        "edge_index": torch.tensor([[0, 1, 1, 2, 3, 4, 4, 5, 6, 6], [1, 0, 2, 1, 4, 3, 5, 4, 5, 3]]),
        "norm_degrees": torch.tensor([2.0, 3.0, 2.0, 3.0, 3.0, 3.0, 3.0]),
        "target_pos": torch.tensor([0, 3]),
        "batch": torch.tensor([0, 0, 0, 1, 1, 1, 1]),
        "edge_weight": torch.ones(e),
    }
    return tuple(ex[n] for n in wrapper.input_names())


def _check_inputs(wrapper: OnnxBatchModel) -> tuple[Tensor, ...]:
    """Another batch than the traced one (11 rows in 3 subgraphs, 16 edges, one row without edges), for
    :func:`_verify`: an export that specialised a size or baked a value of the example in fails on it."""
    gen = torch.Generator().manual_seed(1)
    r = 11
    src = torch.tensor([0, 1, 0, 2, 3, 4, 4, 5, 5, 6, 7, 8, 8, 9, 3, 6])
    dst = torch.tensor([1, 0, 2, 0, 4, 3, 5, 4, 6, 5, 8, 7, 9, 8, 6, 3])
    ex = {
        "x": torch.rand(r, wrapper.model.in_dim, generator=gen) * 2 - 1,
        "edge_index": torch.stack([src, dst]),
        "norm_degrees": 1.0 + torch.rand(r, generator=gen) * 5,
        "target_pos": torch.tensor([0, 3, 7]),
        "batch": torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]),
        "edge_weight": torch.rand(len(src), generator=gen) + 0.5,
    }
    return tuple(ex[n] for n in wrapper.input_names())


def _verify(wrapper: OnnxBatchModel, path: Path) -> None:
    """Run the exported file in onnxruntime on :func:`_check_inputs` and compare with the PyTorch module; raise
    :class:`ExportCheckError` when the inputs differ from those declared or an answer differs by more than 1e-4.
    Skipped (logged) without onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        log.warning("onnxruntime is not installed: %s was not run after the export (pip install 'gnnserve[onnx]')",
                    path)
        return
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    have = [i.name for i in sess.get_inputs()]
    want = wrapper.input_names()
    if have != want:
        raise ExportCheckError(f"the exported model's inputs are {have}, not {want}: the exporter folded an input "
                               "into a constant")
    args = _check_inputs(wrapper)
    with torch.no_grad():
        ref = [t.numpy() for t in wrapper(*args)]
    try:
        got = sess.run(["logits", "probabilities"], {n: a.numpy() for n, a in zip(want, args, strict=True)})
    except Exception as exc:  # onnxruntime's own error types
        raise ExportCheckError(f"the exported model fails on a batch of another size than the traced one: "
                               f"{type(exc).__name__}: {_first_line(exc)}") from exc
    for name, r, g in zip(("logits", "probabilities"), ref, got, strict=True):
        err = float(abs(r - g).max()) if r.size else 0.0
        if r.shape != g.shape or not err <= 1e-4:
            raise ExportCheckError(f"the exported model's {name} differ from the PyTorch model's on a check batch "
                                   f"(shapes {list(g.shape)} and {list(r.shape)}, largest difference {err:.3g})")


def _first_line(exc: BaseException) -> str:
    """An exception's first line of text ('' for none): the exporters' and onnxruntime's messages run to pages."""
    return (str(exc).strip().splitlines() or [""])[0]


class ExportCheckError(RuntimeError):
    """The exported ONNX model does not answer as the checkpoint does (:func:`_verify`)."""


def _dynamic_shapes(wrapper: OnnxBatchModel) -> tuple[dict[int, Any], ...]:
    from torch.export import Dim

    rows, edges, targets = Dim("rows", min=1), Dim("edges", min=0), Dim("targets", min=1)
    spec = {
        "x": {0: rows},
        "edge_index": {1: edges},
        "norm_degrees": {0: rows},
        "target_pos": {0: targets},
        "batch": {0: rows},
        "edge_weight": {0: edges},
    }
    return tuple(spec[n] for n in wrapper.input_names())


def _export(wrapper: OnnxBatchModel, out: Path, dynamo: bool) -> None:
    args = _example_inputs(wrapper)
    names = wrapper.input_names()
    outputs = ["logits", "probabilities"]
    if dynamo:
        prog = torch.onnx.export(
            wrapper, args, dynamo=True, opset_version=OPSET, input_names=names, output_names=outputs,
            dynamic_shapes=(_dynamic_shapes(wrapper),), optimize=True, verbose=False,
        )
        prog.save(str(out))
    else:
        axes = {"x": {0: "rows"}, "edge_index": {1: "edges"}, "norm_degrees": {0: "rows"},
                "target_pos": {0: "targets"}, "batch": {0: "rows"}, "edge_weight": {0: "edges"}}
        dyn = {n: axes[n] for n in names}
        dyn.update({"logits": {0: "targets"}, "probabilities": {0: "targets"}})
        torch.onnx.export(wrapper, args, str(out), dynamo=False, opset_version=OPSET, input_names=names,
                          output_names=outputs, dynamic_axes=dyn)


def _triton_name(ckpt: Any) -> str:
    raw = f"{ckpt.arch}-{ckpt.config['dataset'].get('name', 'model')}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw)


def write_triton_config(path: Path, name: str, wrapper: OnnxBatchModel) -> Path:
    """Write a Triton ``config.pbtxt`` for the exported model (``onnxruntime_onnx`` platform, no batching axis)."""

    def block(kind: str, specs: list[tuple[str, str, list[int]]]) -> str:
        items = []
        for n, dt, dims in specs:
            items.append(f'  {{\n    name: "{n}"\n    data_type: {dt}\n    dims: [ {", ".join(map(str, dims))} ]\n  }}')
        return f"{kind} [\n" + ",\n".join(items) + "\n]\n"

    text = (
        f'name: "{name}"\n'
        'platform: "onnxruntime_onnx"\n'
        "max_batch_size: 0\n"
        + block("input", input_spec(wrapper))
        + block("output", output_spec(wrapper))
        + "instance_group [\n  {\n    kind: KIND_CPU\n    count: 1\n  }\n]\n"
    )
    path.write_text(text)
    return path


def export_onnx(checkpoint_dir: str | os.PathLike[str], out_path: str | os.PathLike[str] | None = None, *,
                triton_repo: str | os.PathLike[str] | None = None, name: str | None = None,
                weighted: bool = False, dynamo: bool = True, check: bool = True) -> dict[str, Any]:
    """Export a checkpoint to ONNX (and optionally a Triton repository); returns what was written.

    Args:
        checkpoint_dir: a checkpoint directory (:mod:`models.checkpoint`).
        out_path: the ``.onnx`` file (default ``model.onnx`` in the current directory; may be
            omitted when ``triton_repo`` is given).
        triton_repo: also write ``<triton_repo>/<name>/config.pbtxt`` and ``.../1/model.onnx``.
        name: Triton model name (default ``<architecture>-<dataset>``).
        weighted: add an ``edge_weight`` input.
        dynamo: use the ``torch.export``-based exporter (default); ``False`` = the TorchScript one.
        check: run ``onnx.checker`` on the result.

    Returns:
        ``{"onnx": path, "triton_config": path or None, "inputs": [...], "outputs": [...], "exporter": ...}``
    """
    ckpt = load_checkpoint(checkpoint_dir)
    wrapper = OnnxBatchModel(ckpt.model, weighted=weighted).eval()
    if out_path is None and triton_repo is None:
        out_path = "model.onnx"
    targets: list[Path] = []
    if out_path is not None:
        targets.append(Path(out_path))
    tri_cfg = None
    mdir = None
    if triton_repo is not None:
        tname = name or _triton_name(ckpt)
        mdir = Path(triton_repo) / tname
        targets.append(mdir / "1" / "model.onnx")
    first = targets[0]
    first.parent.mkdir(parents=True, exist_ok=True)
    tmp = first.with_name(first.name + ".tmp")
    try:  # nothing is written where a user or Triton looks until the model is exported and checked
        with torch.no_grad():
            _export(wrapper, tmp, dynamo)
        if check:
            import onnx

            onnx.checker.check_model(onnx.load(str(tmp)), full_check=True)
            _verify(wrapper, tmp)
        data = tmp.read_bytes()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, first)
    for t in targets[1:]:
        t.parent.mkdir(parents=True, exist_ok=True)
        t.write_bytes(data)
    if mdir is not None:
        tri_cfg = write_triton_config(mdir / "config.pbtxt", tname, wrapper)
    log.info("exported %s to %s", checkpoint_dir, ", ".join(map(str, targets)))
    return {
        "onnx": [str(t) for t in targets],
        "triton_config": str(tri_cfg) if tri_cfg else None,
        "inputs": input_spec(wrapper),
        "outputs": output_spec(wrapper),
        "exporter": "dynamo" if dynamo else "torchscript",
        "opset": OPSET,
    }


def main(argv: Sequence[str] | None = None, prog: str = "gnnserve export-onnx") -> int:
    """CLI entry point; returns the exit code (0 ok, 2 bad checkpoint or arguments, 1 export failure)."""
    p = argparse.ArgumentParser(prog=prog, description="Export a gnnserve checkpoint to ONNX (+ Triton layout).")
    p.add_argument("checkpoint", help="checkpoint directory")
    p.add_argument("--out", default=None, help="ONNX file to write (default model.onnx, or none with --triton-repo)")
    p.add_argument("--triton-repo", default=None, help="also write DIR/NAME/config.pbtxt and DIR/NAME/1/model.onnx")
    p.add_argument("--name", default=None, help="Triton model name (default <architecture>-<dataset>)")
    p.add_argument("--weighted", action="store_true", help="add an edge_weight input")
    p.add_argument("--legacy-exporter", action="store_true", help="use torch.onnx.export(dynamo=False)")
    args = p.parse_args(argv)
    try:
        info = export_onnx(args.checkpoint, args.out, triton_repo=args.triton_repo, name=args.name,
                           weighted=args.weighted, dynamo=not args.legacy_exporter)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the exporter's failures are long; the first line says what failed
        log.debug("export failed", exc_info=True)
        print(f"error: exporting {args.checkpoint} failed ({type(exc).__name__}: {_first_line(exc)}); nothing was "
              "written",
              file=sys.stderr)
        return 1
    for path in info["onnx"]:
        print(f"wrote {path}")
    if info["triton_config"]:
        print(f"wrote {info['triton_config']}")
    print("inputs:  " + ", ".join(f"{n} {dt} {dims}" for n, dt, dims in info["inputs"]))
    print("outputs: " + ", ".join(f"{n} {dt} {dims}" for n, dt, dims in info["outputs"]))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:], prog="python -m models.export_onnx"))
