r"""Approximate personalized PageRank (PPR) by push, the offline top-K index, online push for new nodes.

This is the shaDow-GNN extractor: for a target ``s`` keep the K nodes with the highest
(approximate) PPR score, then take the induced subgraph (:func:`kernels.subgraph.induced_batch`).

Convention
----------
``alpha`` is the **teleport probability** (default 0.15), the same convention as PyG's
``torch_geometric.utils.get_ppr`` and APPNP; the shaDow-GNN reference configuration writes
``alpha = 0.85`` for the same walk. With edge weights ``w(u, v)`` (1 on an unweighted graph),
weighted degree ``w(u) = sum_v w(u, v)`` and ``P = D^{-1} A`` (row-stochastic), the PPR vector of
target ``s`` is the row vector

.. math::

    \pi_s = \alpha e_s + (1 - \alpha)\, \pi_s P                         \quad\text{(default, non-lazy)}

    \pi_s = \alpha e_s + (1 - \alpha)\, \pi_s \tfrac{1}{2}(I + P)       \quad\text{(``lazy=True``)}

A node without out-weight (``w(u) = 0``) keeps the walk where it is (a self-loop). The lazy walk
with teleport ``a`` is exactly the non-lazy walk with teleport ``2a / (1 + a)`` (0.15 -> 0.26):
``lazy=True`` reproduces the reference shaDow-GNN code's walk; the default is the plain walk
(half the pushes for the same ``eps``). :meth:`PPRConfig.teleport` gives the equivalent plain
teleport.

Push (Andersen, Chung and Lang 2006)
------------------------------------
State: estimate ``p`` and residue ``r``, initially ``p = 0``, ``r = e_s``. Invariant, for every
state reached: ``\pi_s = p + \sum_u r(u)\, \pi_u``. While some ``u`` has ``r(u) >= eps * w(u)``
(FIFO queue; the target is always pushed once) push it:

* non-lazy: ``p(u) += alpha r(u)``; each out-neighbour ``v`` gets
  ``r(v) += (1 - alpha) r(u) w(u, v) / w(u)``; ``r(u) = 0``.
* lazy: the same with half of ``(1 - alpha) r(u)`` staying at ``u``.
* ``w(u) = 0``: ``p(u) += r(u)``, ``r(u) = 0`` (the self-loop walk, summed in closed form).

Each push moves at least ``alpha * eps * w(u)`` of mass into ``p`` and ``sum p <= 1``, so the work
of one target is at most ``sum_{pushes} deg(u) <= 1 / (alpha * eps)`` edge updates (667k at the
defaults), independent of the graph size.

Score and error bound
---------------------
The reported score is ``\hat\pi(v) = p(v) + alpha r(v)`` (``r(v) \pi_v(v) >= alpha r(v)`` is
part of the invariant's sum, so this is still a lower bound and never worse than ``p``). When the
queue is empty, ``r(u) < eps * w(u)`` everywhere. On a **symmetric** graph (``w(u, v) = w(v, u)``,
the case of every dataset here) the walk is reversible, ``w(u) \pi_u(v) = w(v) \pi_v(u)``, so

.. math::

    0 \le \pi_s(v) - \hat\pi(v) \le \sum_u r(u) \pi_u(v) < \sum_u \varepsilon w(u) \pi_u(v)
      = \varepsilon w(v) \sum_u \pi_v(u) = \varepsilon\, w(v)

for every node ``v`` (both variants; ``w(v)`` is the degree on an unweighted graph). On a
directed graph only the total is bounded: ``sum_v (\pi_s(v) - p(v)) = sum_u r(u)``.

Consequence for the top-K list: a node whose exact score exceeds the (K-1)-th largest exact score
among the non-target nodes by more than ``eps * w(v)`` is in the list (the estimates of the
nodes ranked above it are lower bounds of their own exact scores).

Lists
-----
List of ``s`` = ``[s] + `` the ``K - 1`` other nodes with the highest ``\hat\pi``, in decreasing
score (ties: smaller id first), dropping nodes with ``\hat\pi(v) < threshold * \hat\pi(s)``
(``threshold`` = the *relative score threshold*, 0 keeps all). ``K`` counts the target.

Implementations
---------------
* :func:`ppr_topk` / :meth:`PPRIndex.build`: one compiled parallel loop (numba ``prange`` over
  worker threads, each walking its share of the targets) with per-thread dense scratch of
  ``O(N)`` (residue and push threshold interleaved so that one edge update touches one cache line;
  estimate; FIFO ring; touched list) reset through the touched list, and an O(T log K) heap
  selection of the top K among the T touched nodes.
* :func:`ppr_new_node`: a node that is not in the graph (virtual id ``N``) given its edges; the
  same push on the graph with that node added, at most ``max_pushes`` pushes, on a dense scratch
  with room for ``N + 1`` nodes (past ``DENSE_NEW_NODE_MAX`` nodes on sparse state: an
  open-addressing hash map from node id to a compact slot, no array of length ``N``).
  :func:`ppr_new_nodes` pushes several such nodes (each alone on the graph) on parallel threads.

The index file (``PPRIndex``) is a directory ``ppr-<graph fingerprint>-<config key>`` holding
``meta.json``, ``ptr.npy`` (int64 ``[N + 1]``), ``nodes.bin`` (int32 or int64 ``[nnz]``) and
``scores.bin`` (float32 ``[nnz]``), opened memory-mapped.

Modules
-------
The push lives in :mod:`kernels.ppr_push` (:class:`PPRConfig`, the compiled kernels and their
per-thread scratch, :func:`ppr_topk`, :func:`ppr_new_node`, :func:`ppr_new_nodes`, :func:`ppr_exact`), the on-disk index
in :mod:`kernels.ppr_index` (:class:`PPRIndex`, :class:`PPRIndexError`, the file format, the
induced-table files). This module re-exports their public names and the private ones other modules
use: import from here. A test that patches one of them patches it in the module that defines it
(the code there looks its names up there, not here).
"""

from __future__ import annotations

from .ppr_index import PPRIndex, PPRIndexError
from .ppr_push import _SCRATCH_KEY as _SCRATCH_KEY
from .ppr_push import _SCRATCH_LOCK as _SCRATCH_LOCK
from .ppr_push import PPRConfig, ppr_exact, ppr_new_node, ppr_new_nodes, ppr_topk
from .ppr_push import _DenseScratch as _DenseScratch
from .ppr_push import _give_dense as _give_dense
from .ppr_push import _push_dense as _push_dense
from .ppr_push import _take_dense as _take_dense
from .ppr_push import _weighted_degree as _weighted_degree

__all__ = [
    "PPRConfig",
    "PPRIndex",
    "PPRIndexError",
    "ppr_exact",
    "ppr_new_node",
    "ppr_new_nodes",
    "ppr_topk",
]
