r"""Feature normalisation, fitted on the training nodes and stored with the model.

A :class:`FeatureNorm` maps raw node features ``x`` ``[n, F]`` to the model's input ``[n, F]`` in
up to three fixed steps (none of them is learnt by gradient descent):

1. ``binarize`` (optional): :math:`x_{ij} \leftarrow [x_{ij} \neq 0]` (what PyG does to the
   keyword counts of Coauthor CS/Physics).
2. ``row`` (modes ``"row"`` and ``"row+standard"``): :math:`x_i \leftarrow x_i / \max(\|x_i\|_1,
   \epsilon)`, the per-node normalisation of Kipf and Welling for bag-of-words features. It needs
   no fitting; a node without features stays zero.
3. ``standard`` (modes ``"standard"`` and ``"row+standard"``): :math:`x_{ij} \leftarrow (x_{ij} -
   \mu_j) / \sigma_j` with :math:`\mu, \sigma` ``[F]`` the mean and standard deviation over the
   **training nodes only** (after steps 1-2). A feature that is constant on the training nodes
   (:math:`\sigma_j < 10^{-6}`) gets :math:`\sigma_j = 1`, so an unseen feature cannot blow up.

``mode="auto"`` (resolved once by :meth:`FeatureNorm.fit`) picks ``"row"`` for sparse non-negative
features (bag-of-words, counts: at most :data:`DENSE_ROW_NNZ` non-zeros per row on average) and
``"standard"`` otherwise: for Gaussian-like features, and for dense non-negative ones, where the
row normalisation makes every entry tiny (about 1/267 on Amazon Computers, 267 non-zeros per
row) and the first layer learns slowly against weight decay. Measured on Amazon Computers with a
plain GCN, 60 full-batch epochs, hidden 64, seed 0: ``"row"`` reached 41% test accuracy (validation
still climbing at 0.53), ``"standard"`` 82% (validation 0.80 after 10 epochs). Cora (18 non-zeros
per row), CiteSeer (32) and Coauthor CS/Physics (60 and 33) keep ``"row"``.

Every step is row-wise, so normalising a subset of rows gives exactly the rows of the normalised
whole: the server can normalise and project node features one node at a time and cache them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor, nn

__all__ = ["DENSE_ROW_NNZ", "NORM_MODES", "FeatureNorm"]

NORM_MODES = ("none", "row", "standard", "row+standard")
_EPS = 1e-12
_MIN_STD = 1e-6
#: ``mode="auto"``: non-negative features with more non-zeros per row than this (on average) are standardised
DENSE_ROW_NNZ = 128


class FeatureNorm(nn.Module):
    """Fixed feature normalisation (see the module docstring).

    Args:
        num_features: ``F``.
        mode: one of ``"none"``, ``"row"``, ``"standard"``, ``"row+standard"`` (``"auto"`` is
            resolved by :meth:`fit`).
        binarize: map every non-zero feature to 1 first.

    Buffers ``mean`` and ``scale`` (float32 ``[F]``) hold the fitted statistics (zeros and ones
    when the mode does not standardise); they travel with the model's weights.
    """

    mean: Tensor
    scale: Tensor

    def __init__(self, num_features: int, mode: str = "none", binarize: bool = False) -> None:
        super().__init__()
        if mode not in (*NORM_MODES, "auto"):
            raise ValueError(f"feature normalisation mode must be one of {(*NORM_MODES, 'auto')}, got {mode!r}")
        self.num_features = int(num_features)
        self.mode = mode
        self.binarize = bool(binarize)
        self.register_buffer("mean", torch.zeros(self.num_features))
        self.register_buffer("scale", torch.ones(self.num_features))

    # ---------------------------------------------------------------- fitting
    @property
    def row(self) -> bool:
        return self.mode in ("row", "row+standard")

    @property
    def standard(self) -> bool:
        return self.mode in ("standard", "row+standard")

    def fit(self, x: np.ndarray | sp.spmatrix, train_nodes: np.ndarray) -> FeatureNorm:
        """Resolve ``"auto"`` and fit ``mean``/``scale`` on the rows ``train_nodes`` of ``x`` ``[N, F]``."""
        rows = x[np.asarray(train_nodes, dtype=np.int64)]
        if self.mode == "auto":
            nonneg = (x.min() >= 0) if not sp.issparse(x) else (x.data.min(initial=0.0) >= 0)
            nnz = x.getnnz() if sp.issparse(x) else int(np.count_nonzero(x))
            dense = nnz > DENSE_ROW_NNZ * max(x.shape[0], 1)
            self.mode = "row" if nonneg and not dense else "standard"
        if self.standard:
            r = self._prestandard_numpy(rows)
            r = r.toarray() if sp.issparse(r) else np.asarray(r)
            r = r.astype(np.float64)
            mu = r.mean(axis=0) if len(r) else np.zeros(self.num_features)
            sd = r.std(axis=0) if len(r) else np.ones(self.num_features)
            sd = np.where(sd < _MIN_STD, 1.0, sd)
            self.mean.copy_(torch.from_numpy(mu.astype(np.float32)))
            self.scale.copy_(torch.from_numpy(sd.astype(np.float32)))
        else:
            self.mean.zero_()
            self.scale.fill_(1.0)
        return self

    def _prestandard_numpy(self, x: np.ndarray | sp.spmatrix) -> np.ndarray | sp.csr_matrix:
        """Steps 1-2 on a NumPy or SciPy matrix (sparse stays sparse)."""
        if sp.issparse(x):
            m = sp.csr_matrix(x, dtype=np.float32, copy=True)
            if self.binarize:
                m.data = (m.data != 0).astype(np.float32)
            if self.row:
                s = np.asarray(abs(m).sum(axis=1)).reshape(-1)
                m = sp.csr_matrix(sp.diags(1.0 / np.maximum(s, _EPS)).astype(np.float32) @ m)
            return m
        a = np.asarray(x, dtype=np.float32)
        if self.binarize:
            a = (a != 0).astype(np.float32)
        if self.row:
            a = a / np.maximum(np.abs(a).sum(axis=1, keepdims=True), _EPS)
        return a

    # ---------------------------------------------------------------- applying
    def forward(self, x: Tensor) -> Tensor:
        """Normalise raw features ``x`` ``[n, F]`` -> ``[n, F]`` (float32, row-wise)."""
        if x.dim() != 2 or x.shape[1] != self.num_features:
            raise ValueError(f"features must have shape [n, {self.num_features}], got {tuple(x.shape)}")
        if self.mode == "auto":
            raise RuntimeError("FeatureNorm mode 'auto' was never fitted: call fit() first")
        x = x.to(self.mean.dtype)
        if self.binarize:
            x = (x != 0).to(x.dtype)
        if self.row:
            x = x / x.abs().sum(dim=1, keepdim=True).clamp(min=_EPS)
        if self.standard:
            x = (x - self.mean) / self.scale
        return x

    def apply_sparse(self, x: sp.spmatrix) -> sp.csr_matrix:
        """Normalise a SciPy sparse matrix, staying sparse; only for modes that keep zeros at zero."""
        if self.standard:
            raise ValueError(f"mode {self.mode!r} does not keep zeros at zero; normalise densely")
        return self._prestandard_numpy(x)

    def config(self) -> dict[str, Any]:
        return {"mode": self.mode, "binarize": self.binarize, "num_features": self.num_features}

    def extra_repr(self) -> str:
        return f"{self.num_features}, mode={self.mode!r}, binarize={self.binarize}"
