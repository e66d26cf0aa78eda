"""gnnserve kernels: the graph layer, ES-SpMM sampled aggregation, PPR extraction, subgraph batching.

Nothing in here imports from ``models``, ``serve`` or ``clients``.
"""

from .datasets import DatasetError, GraphDataset, load_dataset, load_npz, save_npz, synthetic_sbm
from .graph import CSRGraph, GraphFormatError
from .spmm import kept_edges, sampled_spmm, sampled_spmm_torch
from .subgraph import ExtraEdges, SubgraphBatch, induced_batch, lhop_nodes

__all__ = [
    "CSRGraph",
    "DatasetError",
    "ExtraEdges",
    "GraphDataset",
    "GraphFormatError",
    "SubgraphBatch",
    "induced_batch",
    "kept_edges",
    "lhop_nodes",
    "load_dataset",
    "load_npz",
    "sampled_spmm",
    "sampled_spmm_torch",
    "save_npz",
    "synthetic_sbm",
]
