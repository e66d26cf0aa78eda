"""Memory of a live PPR update (kernels.ppr_live) and equivalence with the materialising algorithm.

A bulk update (thousands of changed rows) runs one reverse push per changed row, each touching a
large part of the graph. The update used to materialise one ``(push, source, estimate)`` entry
per source touched per push, then a dozen NumPy temporaries and sorts of that size (1.1e8 entries
and past 4 GB on a 200k-node products-shaped graph with 2,000 added edges); it now adds the terms
up as each push ends. These tests check:

* the drift of every source (the per-source sum of the bounds) and the recomputed lists are
  exactly, bit for bit, those of the old algorithm, which is reproduced here as it was (its
  compiled kernel and its NumPy post-processing), over sequences of edits: overlay lists, merges,
  holders in the overlay, capped reverse pushes, new nodes, a weighted lazy graph;
* the NumPy memory traced during :meth:`LivePPRIndex.prepare` stays within ``O(N + holders +
  push_chunk K)`` plus the recomputed lists themselves, whatever the number of edited edges (the
  old algorithm exceeds that bound by an order of magnitude on the same edit);
* the chunked helpers (``push_chunk``, the chunked copy of every list at a merge) return what the
  unchunked calls return.
"""

from __future__ import annotations

import math
import tracemalloc

import numba
import numpy as np
import pytest

import kernels.ppr_live as pl
from kernels.datasets import synthetic_sbm
from kernels.graph import CSRGraph
from kernels.graph_edit import GraphEdit, apply_edit, edit_from_pairs
from kernels.ppr import _SCRATCH_KEY, PPRConfig, PPRIndex, _weighted_degree, ppr_topk
from kernels.ppr_live import LivePPRIndex
from kernels.subgraph import _grow

from .test_ppr_live import assert_fresh_lists

_TINY = 1e-300


# ============================================================================ the old algorithm, as it was
@numba.njit(cache=False, nogil=True)
def _old_reverse_estimates(
    indptr, indices, weights, wdeg, srcs, eps_rs, alpha, lazy, max_pushes, r, p, queue, touched
):  # pragma: no cover - compiled
    """The kernel before the fix, verbatim: every (push, touched node, estimate) entry."""
    has_w = weights.shape[0] > 0
    qcap = queue.shape[0]
    o_own = np.empty(1024, dtype=np.int64)
    o_node = np.empty(1024, dtype=np.int64)
    o_est = np.empty(1024, dtype=np.float64)
    no = 0
    capped = 0
    for i in range(srcs.shape[0]):
        src = srcs[i]
        eps = eps_rs[i]
        r[src] = 1.0
        touched[0] = src
        nt = 1
        queue[0] = src
        head = 0
        tail = 1
        qlen = 1
        pushes = 0
        while qlen > 0:
            u = queue[head]
            head += 1
            if head == qcap:
                head = 0
            qlen -= 1
            ru = r[u]
            pushes += 1
            wu = wdeg[u]
            if wu <= 0.0:
                p[u] += ru
                r[u] = _TINY
            else:
                p[u] += alpha * ru
                r[u] = _TINY
                spread = (1.0 - alpha) * ru
                if lazy:
                    spread *= 0.5
                c = spread / wu
                for e in range(indptr[u], indptr[u + 1]):
                    v = indices[e]
                    old = r[v]
                    new = old + (c * weights[e] if has_w else c)
                    r[v] = new
                    if old == 0.0:
                        touched[nt] = v
                        nt += 1
                    wv = wdeg[v]
                    thr = eps * wv if wv > 0.0 else eps
                    if old < thr and new >= thr:
                        queue[tail] = v
                        tail += 1
                        if tail == qcap:
                            tail = 0
                        qlen += 1
                if lazy:
                    old = r[u]
                    new = old + spread
                    r[u] = new
                    thr = eps * wu
                    if old < thr and new >= thr:
                        queue[tail] = u
                        tail += 1
                        if tail == qcap:
                            tail = 0
                        qlen += 1
            if max_pushes > 0 and pushes >= max_pushes and qlen > 0:
                capped += 1
                break
        if no + nt > o_own.shape[0]:
            o_own = _grow(o_own, no + nt)
            o_node = _grow(o_node, no + nt)
            o_est = _grow(o_est, no + nt)
        for j in range(nt):
            v = touched[j]
            o_own[no] = i
            o_node[no] = v
            o_est[no] = p[v] + alpha * r[v]
            no += 1
            r[v] = 0.0
            p[v] = 0.0
    return o_own[:no], o_node[:no], o_est[:no], capped


def old_update(live: LivePPRIndex, old_graph: CSRGraph, new_graph: CSRGraph, changed_rows, new_ids):
    """What the old ``prepare`` computed, from ``live``'s state before the update: ``(drift after
    the update, recomputed sources, candidates, capped)``, without changing ``live``."""
    cfg = live.config
    n_old = live.num_nodes
    drift = live._drift.copy()
    changed = np.unique(np.asarray(changed_rows, dtype=np.int64))
    rows = changed[changed < n_old]
    recompute = np.zeros(0, dtype=np.int64)
    candidates = capped = 0
    if len(rows):
        coef = live._coefficients(old_graph, new_graph, rows)  # the rule's c_u (its own tests: test_ppr_live)
        hs, hx, hsc = live._holders(rows)
        # the old _reverse_terms
        wd = _weighted_degree(old_graph)
        tol = live.tol_factor * cfg.eps
        act = np.flatnonzero((coef > 0) & (wd[rows] > 0))
        if not len(act):
            s_rev, c_rev = np.zeros(0, dtype=np.int64), np.zeros(0)
        else:
            n = old_graph.num_nodes
            r, p = np.zeros(n), np.zeros(n)
            queue, touched = np.zeros(n + 1, dtype=np.int64), np.zeros(n + 1, dtype=np.int64)
            u = rows[act]
            eps_r = tol / (2.0 * len(act) * wd[u] * coef[act])
            w = old_graph.weights if old_graph.weights is not None else np.zeros(0, dtype=np.float32)
            cap = live.reverse_max_pushes
            if live.reverse_total_pushes > 0:
                share = max(1, live.reverse_total_pushes // len(act))
                cap = share if cap <= 0 else min(cap, share)
            own, node, est, capped = _old_reverse_estimates(
                old_graph.indptr,
                old_graph.indices,
                w,
                wd,
                u,
                eps_r,
                cfg.alpha,
                cfg.lazy,
                cap,
                r,
                p,
                queue,
                touched,
            )
            ui = act[own]
            ws = wd[node]
            term = est * wd[rows[ui]] / np.where(ws > 0, ws, 1.0)
            term = np.minimum(term, live._last_scores(node)) * coef[ui]
            big = term > 0
            node, ui, term = node[big], ui[big], term[big]
            if len(hs):
                nr = len(rows)
                dup = np.isin(node * nr + ui, hs * nr + hx)
                node, term = node[~dup], term[~dup]
            s_rev, c_rev = node, term
        # the old accumulation
        # the sums, in whole quanta of tol / 2**32 (each positive term rounded up): integers, in any order
        s_all = np.concatenate([hs, s_rev])
        contrib = np.concatenate([hsc.astype(np.float64) * coef[hx], c_rev])
        pos = contrib > 0
        s_all, contrib = s_all[pos], contrib[pos]
        if len(s_all):
            q = math.ldexp(live.tol_factor * cfg.eps, -32)
            units = np.minimum(np.ceil(contrib / q), 2.0**53).astype(np.int64)
            uniq, inv = np.unique(s_all, return_inverse=True)
            sums = np.zeros(len(uniq), dtype=np.int64)
            np.add.at(sums, inv, units)
            d = drift[uniq] + sums.astype(np.float64) * q
            drift[uniq] = d
            candidates = len(uniq)
            recompute = uniq[d > live.tol_factor * cfg.eps]
    targets = np.concatenate([recompute, np.asarray(new_ids, dtype=np.int64)])
    n_new = new_graph.num_nodes
    if n_new > len(drift):
        drift = np.concatenate([drift, np.zeros(n_new - len(drift))])
    drift[targets] = 0.0
    return drift, recompute, candidates, int(capped)


# ============================================================================ graphs and edits
SBM_CFG = PPRConfig(topk=24, eps=1e-4)


@pytest.fixture(scope="module")
def sbm():
    g = synthetic_sbm(800, num_classes=4, avg_degree=10, num_features=4, seed=11).graph
    return g, PPRIndex.build(g, SBM_CFG, progress=False)


def random_edit(rng, g, *, adds, rems, new=0):
    n = g.num_nodes
    src = g.row_ids()
    keep = src < g.indices
    ex_s, ex_d = src[keep].astype(np.int64), g.indices[keep].astype(np.int64)
    pick = rng.choice(len(ex_s), size=min(rems, len(ex_s)), replace=False)
    rem = {(int(ex_s[i]), int(ex_d[i])) for i in pick}
    add: set[tuple[int, int]] = set()
    while len(add) < adds:
        u, v = sorted(int(x) for x in rng.integers(n, size=2))
        if u != v and v not in g.neighbors(u):
            add.add((u, v))
    ptr, nbrs = [0], []
    for j in range(new):
        nbrs.extend(int(x) for x in rng.choice(n + j, size=3, replace=False))
        ptr.append(len(nbrs))
    return GraphEdit.make(
        new_count=new, new_ptr=ptr, new_nbrs=nbrs,
        add_src=[a for a, _ in add], add_dst=[b for _, b in add],
        rem_src=[a for a, _ in rem], rem_dst=[b for _, b in rem],
    )  # fmt: skip


def check_sequence(live: LivePPRIndex, g: CSRGraph, rng, sizes, cfg) -> dict[str, int]:
    """Apply edits of the given ``(adds, rems, new)`` sizes; after each, the drift of every source
    equals the old algorithm's bit for bit, and so do the recomputed set, the candidate and capped
    counts; the recomputed lists are a fresh push; the scratch is zero again."""
    seen = {"recomputed": 0, "capped": 0, "overlay_holders": 0}
    for adds, rems, new in sizes:
        eff = apply_edit(g, random_edit(rng, g, adds=adds, rems=rems, new=new))
        if live._a_fill:
            rows = np.unique(eff.changed_rows[eff.changed_rows < live.num_nodes])
            an = live._a_nodes[: live._a_fill]
            seen["overlay_holders"] += int(np.isin(an, rows).sum())
        drift, recompute, candidates, capped = old_update(live, g, eff.graph, eff.changed_rows, eff.new_ids)
        st = live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
        g = eff.graph
        n = live.num_nodes  # the per-node arrays keep spare room past the nodes
        assert live._drift[:n].tobytes() == drift[:n].tobytes()  # bit for bit, every source
        np.testing.assert_array_equal(live.last_recomputed, recompute)
        assert st["candidates"] == candidates and st["reverse_capped"] == capped
        targets = np.concatenate([live.last_recomputed, live.last_new])
        if len(targets):
            assert_fresh_lists(live, g, targets, cfg)
        sc = live._sums  # prepare's scratch, back to its resting state
        assert not sc.acc.any() and not sc.mark.any() and not sc.counts.any()
        for dense in g.cache().get(_SCRATCH_KEY, []):  # the pooled push scratch the reverse pushes borrowed
            assert not dense.rw[:, :, 0].any() and not dense.p.any()
        seen["recomputed"] += st["recomputed"]
        seen["capped"] += capped
    return seen


# ============================================================================ (1) same results as before
@pytest.mark.parametrize("gather", [0.0, float("inf")], ids=["gathered-last-scores", "scores-read-per-term"])
@pytest.mark.parametrize(("tol_factor", "merge_fraction"), [(1.0, 0.25), (100.0, 0.5), (30.0, 0.02)])
def test_drift_and_recomputation_equal_the_old_algorithm(sbm, tol_factor, merge_fraction, gather, monkeypatch):
    monkeypatch.setattr(pl, "_GATHER_LAST", gather)
    g, base = sbm
    live = LivePPRIndex(base, tol_factor=tol_factor, merge_fraction=merge_fraction, push_chunk=7)
    sizes = [(1, 0, 0), (3, 2, 1), (40, 10, 0), (1, 1, 0), (200, 30, 2), (5, 5, 0), (2, 0, 0), (8, 1, 0)]
    seen = check_sequence(live, g, np.random.default_rng(1), sizes, SBM_CFG)
    assert seen["recomputed"] > 0
    if tol_factor == 100.0:  # lists kept in the overlay across edits: its holders and last scores were used
        assert seen["overlay_holders"] > 0


def test_drift_equals_the_old_algorithm_with_capped_reverse_pushes(sbm):
    g, base = sbm
    live = LivePPRIndex(base, reverse_max_pushes=50, reverse_total_pushes=3_000, tol_factor=0.5, push_chunk=3)
    seen = check_sequence(live, g, np.random.default_rng(2), [(150, 20, 0), (30, 0, 1), (2, 2, 0)], SBM_CFG)
    assert seen["capped"] > 0 and seen["recomputed"] > 0


@pytest.mark.parametrize("rule", ["node", "l1"])
def test_drift_equals_the_old_algorithm_on_a_weighted_lazy_graph(rule):
    rng = np.random.default_rng(4)
    ei = rng.integers(0, 400, size=(2, 2400))
    g = CSRGraph.from_edge_index(ei, num_nodes=400, weights=rng.uniform(0.2, 3.0, 2400), symmetrize=True,
                                 remove_self_loops=True)  # fmt: skip
    cfg = PPRConfig(topk=16, eps=1e-4, lazy=True)
    live = LivePPRIndex(PPRIndex.build(g, cfg, progress=False), rule=rule, merge_fraction=0.05)
    seen = check_sequence(
        live, g, np.random.default_rng(5), [(4, 2, 1), (60, 10, 0), (3, 3, 0), (1, 0, 0)], cfg
    )
    assert seen["recomputed"] > 0


def test_merged_sums_saturate():
    """Two workers' sums, each at the cap, merge into the cap (their plain sum wraps int64: QA found a bound of
    -2**31 tol, which hid the source from every later edit, at a tiny tolerance)."""
    acc = np.zeros((3, 4), dtype=np.int64)
    acc[0, 1] = acc[1, 1] = acc[2, 1] = pl._SUM_MAX
    acc[1, 2], acc[2, 3] = 5, pl._SUM_MAX - 1
    acc[0, 3] = 7
    seen = np.array([[1, 3, 0, 0], [1, 2, 0, 0], [1, 3, 0, 0]], dtype=np.int32)
    counts = np.array([2, 2, 2], dtype=np.int64)
    pl._merge_sums(acc, seen, counts)
    assert acc[0].tolist() == [0, pl._SUM_MAX, 5, pl._SUM_MAX] and not acc[1:].any()
    assert counts.tolist() == [3, 0, 0] and sorted(seen[0, :3].tolist()) == [1, 2, 3]


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
@pytest.mark.parametrize("tol_factor", [2.0, 1e-8])  # 1e-8: terms of 2**53 quanta, workers' sums at the cap
def test_drift_is_the_same_on_any_number_of_workers(sbm, tol_factor):
    """The reverse pushes run on every numba worker, each summing into its own accumulator: the sums are
    integers (quanta), so one worker and several give the same drift, recomputed set and counts, bit for bit."""
    g, base = sbm
    runs = []
    for threads in (1, 2, numba.config.NUMBA_NUM_THREADS):
        before = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            live = LivePPRIndex(base, reverse_max_pushes=80, reverse_total_pushes=5_000, tol_factor=tol_factor)
            rng, cur, out = np.random.default_rng(9), g, []
            for adds, rems, new in [(120, 15, 1), (3, 1, 0), (40, 40, 2)]:
                eff = apply_edit(cur, random_edit(rng, cur, adds=adds, rems=rems, new=new))
                st = live.apply(cur, eff.graph, eff.changed_rows, eff.new_ids)
                assert live._sums.threads == threads
                st.pop("microseconds")
                out.append((live._drift[: live.num_nodes].tobytes(), live.last_recomputed.tolist(), st))
                cur = eff.graph
        finally:
            numba.set_num_threads(before)
        runs.append(out)
    assert runs[0][0][2]["reverse_capped"] > 0 and runs[0][0][2]["recomputed"] > 0
    assert runs[1] == runs[0] and runs[2] == runs[0]
    assert all(np.frombuffer(d, dtype=np.float64).min() >= 0 for d, _, _ in runs[0])  # never a negative bound


def test_push_chunk_and_chunked_list_copy_change_nothing(sbm, monkeypatch):
    g, base = sbm
    live = LivePPRIndex(base, push_chunk=5, tol_factor=100.0, merge_fraction=0.5)
    targets = np.array([3, 1, 700, 42, 5, 6, 9, 100, 2, 2, 31, 17], dtype=np.int64)
    for got, want in zip(live._push(g, targets), ppr_topk(g, targets, SBM_CFG), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    rng = np.random.default_rng(6)
    eff = apply_edit(g, random_edit(rng, g, adds=30, rems=5, new=2))
    live.apply(g, eff.graph, eff.changed_rows, eff.new_ids)
    assert live._a_fill > 0
    n = live.num_nodes
    want = live.lookup(np.arange(n), return_scores=True)
    monkeypatch.setattr(pl, "_LOOKUP_CHUNK", 50)  # 2 targets per chunk at K = 24
    got = live._all_lists(stored=True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    assert got[1].dtype == np.int32 and got[2].dtype == np.float32
    np.testing.assert_array_equal(live.nodes, want[1])  # the materialised CSR view
    live._merge()
    assert live._a_fill == 0
    np.testing.assert_array_equal(live.lookup(np.arange(n), return_scores=True)[1], want[1])


def test_push_chunk_is_checked(sbm):
    with pytest.raises(ValueError, match="push_chunk"):
        LivePPRIndex(sbm[1], push_chunk=0)


# ============================================================================ (2) bounded memory
@pytest.fixture(scope="module")
def products():
    """A small products-shaped graph (mean degree 50, heavy-tailed) and its index: reverse pushes
    from a bulk edit's rows reach most of the graph, as on the real one."""
    g = synthetic_sbm(4000, avg_degree=30.0, power=3.0, num_features=4, num_classes=8, p_in=0.8, seed=0).graph
    cfg = PPRConfig(topk=16, eps=1e-4)
    return g, PPRIndex.build(g, cfg, progress=False)


def traced_prepare(live: LivePPRIndex, g: CSRGraph, eff) -> tuple[int, dict]:
    """Peak NumPy memory traced during ``prepare`` (compilation and the inverse index done before)."""
    live._inverse()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base_now, _ = tracemalloc.get_traced_memory()
        prep = live.prepare(g, eff.graph, eff.changed_rows, eff.new_ids)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base_now, prep


def old_entries(live: LivePPRIndex, old_graph: CSRGraph, new_graph: CSRGraph, rows: np.ndarray) -> int:
    """How many (push, source) entries the old kernel materialised for this edit."""
    cfg = live.config
    coef = live._coefficients(old_graph, new_graph, rows)
    wd = _weighted_degree(old_graph)
    act = np.flatnonzero((coef > 0) & (wd[rows] > 0))
    n = old_graph.num_nodes
    u = rows[act]
    eps_r = live.tol_factor * cfg.eps / (2.0 * len(act) * wd[u] * coef[act])
    cap = min(live.reverse_max_pushes, max(1, live.reverse_total_pushes // len(act)))
    own, _, _, _ = _old_reverse_estimates(
        old_graph.indptr, old_graph.indices, np.zeros(0, dtype=np.float32), wd, u, eps_r, cfg.alpha, cfg.lazy, cap,
        np.zeros(n), np.zeros(n), np.zeros(n + 1, dtype=np.int64), np.zeros(n + 1, dtype=np.int64),
    )  # fmt: skip
    return len(own)


@pytest.mark.parametrize("edges", [20, 600])
def test_update_memory_does_not_grow_with_the_reverse_reach(products, edges):
    g, base = products
    n = g.num_nodes
    warm = LivePPRIndex(base)  # compile the kernels outside the measurement
    e1 = apply_edit(g, edit_from_pairs(add=[(0, n - 1)] if n - 1 not in g.neighbors(0) else [(1, n - 1)]))
    warm.apply(g, e1.graph, e1.changed_rows, e1.new_ids)

    live = LivePPRIndex(base)
    live.push_chunk = 64  # an attribute: the same test runs against the old module (which ignores it)
    # the QA report's edit, scaled: edges between two blocks of consecutive ids
    pairs = [(n - 2 * edges + i, n - edges + i) for i in range(edges)]
    eff = apply_edit(g, edit_from_pairs(add=[(u, v) for u, v in pairs if v not in g.neighbors(u)]))
    rows = np.unique(eff.changed_rows)
    holders = len(live._holders(rows)[0])
    degs = int(g.degrees[rows].sum() + eff.graph.degrees[rows].sum())
    peak, prep = traced_prepare(live, g, eff)

    lists = prep["lists"]
    out = sum(a.nbytes for a in lists) if lists is not None else 0
    # O(N) scratch (drift, accumulators, marks, memo of last scores, degrees), the holders and the
    # changed rows' entries (a few arrays of each), one push chunk's padded [B, K] arrays, the
    # recomputed lists twice (the chunks', then concatenated) and a constant; nothing proportional
    # to (changed rows) x (reverse reach)
    bound = 64 * n + 64 * holders + 160 * degs + 48 * live.k_max * live.push_chunk + 2 * out + (256 << 10)
    assert peak <= bound, (peak, bound)
    if edges > 100:  # the old algorithm's one int64 array over its entries is already above the bound
        assert 8 * old_entries(live, g, eff.graph, rows) > 2 * bound
    st = live.install(prep)
    assert st["recomputed"] > 0 and live.num_nodes == eff.graph.num_nodes
