"""gnnserve kernels: the graph layer, ES-SpMM sampled aggregation, PPR extraction, subgraph batching.

Nothing in here imports from ``models``, ``serve`` or ``clients``.
"""

from .datasets import DatasetError, GraphDataset, load_dataset, load_npz, save_npz, synthetic_sbm
from .graph import CSRGraph, GraphFormatError
from .spmm import kept_edges, sampled_spmm, sampled_spmm_torch

__all__ = [
    "CSRGraph",
    "DatasetError",
    "GraphDataset",
    "GraphFormatError",
    "kept_edges",
    "load_dataset",
    "load_npz",
    "sampled_spmm",
    "sampled_spmm_torch",
    "save_npz",
    "synthetic_sbm",
]
