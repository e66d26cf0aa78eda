"""gnnserve kernels: the graph layer, ES-SpMM sampled aggregation, PPR extraction, subgraph batching.

Nothing in here imports from ``models``, ``serve`` or ``clients``.
"""

from .datasets import DatasetError, GraphDataset, load_dataset, load_npz, save_npz, synthetic_sbm
from .graph import CSRGraph, GraphFormatError
from .graph_edit import EditEffect, GraphEdit, GraphEditError, apply_edit
from .ppr import PPRConfig, PPRIndex, PPRIndexError, ppr_exact, ppr_new_node, ppr_topk
from .ppr_live import LivePPRIndex
from .spmm import kept_edges, sampled_spmm, sampled_spmm_torch
from .subgraph import ExtraEdges, InducedTable, SubgraphBatch, induced_batch, lhop_nodes

__all__ = [
    "CSRGraph",
    "DatasetError",
    "EditEffect",
    "ExtraEdges",
    "GraphDataset",
    "GraphEdit",
    "GraphEditError",
    "GraphFormatError",
    "InducedTable",
    "LivePPRIndex",
    "PPRConfig",
    "PPRIndex",
    "PPRIndexError",
    "SubgraphBatch",
    "apply_edit",
    "induced_batch",
    "kept_edges",
    "lhop_nodes",
    "load_dataset",
    "load_npz",
    "ppr_exact",
    "ppr_new_node",
    "ppr_topk",
    "sampled_spmm",
    "sampled_spmm_torch",
    "save_npz",
    "synthetic_sbm",
]
