"""The embedded default: features in process memory or memory-mapped from a file.

One fancy-index (``np.take`` along rows) answers a batch, duplicates included, so this store skips
the deduplication the remote stores do. The array may be a read-only ``np.memmap`` (a ``.npy``
file or a saved dataset directory opened with ``mmap``): several server processes on one host then
share the page cache instead of each holding a copy.

float16 storage is accepted (``dtype`` reports it) and widened to float32 per call.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry

from .base import FeatureStore, FeatureUnavailable, check_node_ids

__all__ = ["MemoryFeatureStore"]


class MemoryFeatureStore(FeatureStore):
    """Features held in (or mapped into) this process.

    Args:
        x: ``[N, F]`` float32 or float16 array (a memory map is fine; it is never written).
        name: label for stats and metrics (default ``"memory"``).
        registry: Prometheus registry for :mod:`serve.features.metrics` (``None``: no metrics).
        check_finite: scan the whole array once at construction and refuse NaN/inf (datasets
            loaded through ``kernels.datasets`` are already checked; a raw ``.npy`` may not be).
    """

    name = "memory"

    def __init__(
        self,
        x: np.ndarray,
        *,
        name: str | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        check_finite: bool = False,
    ) -> None:
        super().__init__(name=name, registry=registry)
        arr = np.asarray(x) if not isinstance(x, np.memmap) else x
        if arr.ndim != 2:
            raise ValueError(f"features must be a 2-D array [N, F], got shape {arr.shape}")
        if arr.dtype not in (np.float32, np.float16):
            raise ValueError(f"features must be float32 or float16, got {arr.dtype} (convert first)")
        if check_finite and not bool(np.isfinite(arr).all()):
            raise ValueError("features contain NaN or infinite values")
        self._x: np.ndarray | None = arr
        self._shape = (int(arr.shape[0]), int(arr.shape[1]))
        self._dtype = arr.dtype

    # ---------------------------------------------------------------- constructors
    @classmethod
    def from_dataset(cls, dataset: Any, **kwargs: Any) -> MemoryFeatureStore:
        """Wrap ``dataset.x`` of a :class:`kernels.datasets.GraphDataset` (no copy)."""
        return cls(dataset.x, **kwargs)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, mmap: bool = True, **kwargs: Any) -> MemoryFeatureStore:
        """Open features from a file: a ``.npy`` array, a ``.npz`` dataset, or a saved dataset
        directory (``x.npy`` inside it). ``.npy`` and directories are memory-mapped when ``mmap``.
        """
        p = Path(path)
        if p.is_dir():
            inner = p / "x.npy"
            if not inner.exists():
                raise FileNotFoundError(f"{p} holds no x.npy: not a saved dataset directory")
            p = inner
        if p.suffix == ".npy":
            arr = np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False)
            kwargs.setdefault("check_finite", not mmap)
            return cls(arr, **kwargs)
        if p.suffix == ".npz":
            from kernels.datasets import load_npz

            return cls(load_npz(p).x, **kwargs)
        raise ValueError(f"cannot open features from {p}: expected a .npy, .npz or dataset directory")

    # ---------------------------------------------------------------- shape
    @property
    def num_nodes(self) -> int:
        return self._shape[0]

    @property
    def num_features(self) -> int:
        return self._shape[1]

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def array(self) -> np.ndarray:
        """The underlying ``[N, F]`` array (read it, never write it)."""
        self._check_open()
        assert self._x is not None
        return self._x

    # ---------------------------------------------------------------- reads
    def get(self, node_ids: Any) -> np.ndarray:
        """One fancy-index; duplicates need no deduplication here."""
        self._check_open()
        ids = check_node_ids(node_ids, self.num_nodes)
        t0 = time.perf_counter()
        out = self._take(ids)
        self._account(len(ids), len(ids), time.perf_counter() - t0)
        return out

    def _fetch_unique(self, ids: np.ndarray) -> np.ndarray:
        return self._take(ids)

    def _take(self, ids: np.ndarray) -> np.ndarray:
        x = self._x
        if x is None:
            raise FeatureUnavailable(f"feature store {self.name!r} is closed")
        rows = np.take(x, ids, axis=0)
        return rows if rows.dtype == np.float32 else rows.astype(np.float32)

    def close(self) -> None:
        """Drop the reference to the array (a memory map is unmapped once nothing else holds it)."""
        super().close()
        self._x = None

    def __repr__(self) -> str:
        return f"MemoryFeatureStore(name={self.name!r}, shape={self._shape}, dtype={self._dtype})"
