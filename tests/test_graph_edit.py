"""Structural graph edits (kernels.graph_edit) against a rebuild from the edited edge list."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels.graph_edit as ge
from kernels.graph import CSRGraph
from kernels.graph_edit import GraphEdit, GraphEditError, apply_edit, edit_from_pairs


# ============================================================================ reference
def sym_graph(rng, n, e, *, weighted, loops=False):
    ei = rng.integers(0, n, size=(2, e))
    w = rng.uniform(0.1, 3.0, size=e).astype(np.float32) if weighted else None
    return CSRGraph.from_edge_index(ei, num_nodes=n, weights=w, symmetrize=True, remove_self_loops=not loops)


def edge_dict(g):
    ei = g.edge_index()
    w = g.edge_weights()
    return {(int(a), int(b)): float(x) for a, b, x in zip(ei[0], ei[1], w, strict=True)}


def reference(g, edit):
    """The edited graph rebuilt from scratch with CSRGraph.from_edge_index (dict bookkeeping)."""
    d = edge_dict(g)
    n = g.num_nodes
    m = edit.new_count
    nw = edit.new_weights if edit.new_weights is not None else np.ones(len(edit.new_nbrs), np.float32)
    for j in range(m):
        for i in range(edit.new_ptr[j], edit.new_ptr[j + 1]):
            v, w = int(edit.new_nbrs[i]), float(nw[i])
            d[(n + j, v)] = w
            d[(v, n + j)] = w
    for u, v in zip(edit.rem_src, edit.rem_dst, strict=True):
        del d[(int(u), int(v))]
        d.pop((int(v), int(u)), None)
    aw = edit.add_w if edit.add_w is not None else np.ones(len(edit.add_src), np.float32)
    for u, v, w in zip(edit.add_src, edit.add_dst, aw, strict=True):
        d[(int(u), int(v))] = float(w)
        d[(int(v), int(u))] = float(w)
    weighted = g.is_weighted or bool(np.any(nw != 1)) or bool(np.any(aw != 1))
    keys = list(d)
    ei = np.array(keys, dtype=np.int64).T.reshape(2, -1)
    w = np.array([d[k] for k in keys], dtype=np.float32) if weighted else None
    return CSRGraph.from_edge_index(ei, num_nodes=n + m, weights=w)


def changed_reference(old, new):
    out = []
    for r in range(new.num_nodes):
        if r >= old.num_nodes:
            out.append(r)
            continue
        a = slice(old.indptr[r], old.indptr[r + 1])
        b = slice(new.indptr[r], new.indptr[r + 1])
        if not (np.array_equal(old.indices[a], new.indices[b])
                and np.array_equal(old.edge_weights()[a], new.edge_weights()[b])):  # fmt: skip
            out.append(r)
    return np.array(out, dtype=np.int64)


def assert_same_graph(got, want):
    assert got.num_nodes == want.num_nodes
    assert got.indices.dtype == want.indices.dtype
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    assert (got.weights is None) == (want.weights is None)
    if want.weights is not None:
        assert got.weights.dtype == np.float32
        np.testing.assert_array_equal(got.weights, want.weights)
    got.validate()


def random_edit(rng, g, *, max_new=3, max_rem=6, max_add=6, weights="mixed", loops=False):
    """A valid random edit: new nodes linking old and earlier new nodes, removals of existing
    (old or new-node) edges, additions of absent pairs (possibly re-adding a removed one)."""
    n = g.num_nodes
    m = int(rng.integers(0, max_new + 1))
    ptr = [0]
    nbrs: list[int] = []
    existing = {(min(a, b), max(a, b)) for (a, b) in edge_dict(g)}
    for j in range(m):
        cands = n + j
        k = int(rng.integers(0, min(5, cands) + 1)) if cands else 0
        chosen = rng.choice(cands, size=k, replace=False) if k else np.zeros(0, dtype=np.int64)
        nbrs.extend(int(x) for x in chosen)
        ptr.append(len(nbrs))
        existing |= {(min(int(x), n + j), max(int(x), n + j)) for x in chosen}
    ex = sorted(existing)
    r = min(len(ex), int(rng.integers(0, max_rem + 1)))
    rem = [ex[i] for i in rng.choice(len(ex), size=r, replace=False)] if r else []
    rem = [(b, a) if rng.random() < 0.5 else (a, b) for a, b in rem]  # either direction names it
    after = existing - {(min(a, b), max(a, b)) for a, b in rem}
    add: list[tuple[int, int]] = []
    n2 = n + m
    tries = 0
    want = int(rng.integers(0, max_add + 1))
    while len(add) < want and tries < 200 and n2 > 1:
        tries += 1
        if rem and rng.random() < 0.2:
            a, b = rem[int(rng.integers(len(rem)))]
        else:
            a, b = int(rng.integers(n2)), int(rng.integers(n2))
        key = (min(a, b), max(a, b))
        if (a == b and not loops) or key in after:
            continue
        after.add(key)
        add.append((a, b))

    def w(size):
        if weights == "ones" or (weights == "mixed" and rng.random() < 0.5):
            return None
        return rng.uniform(0.0, 2.0, size=size).astype(np.float32)

    return GraphEdit.make(
        new_count=m, new_ptr=ptr, new_nbrs=nbrs, new_weights=w(len(nbrs)),
        add_src=[a for a, _ in add], add_dst=[b for _, b in add], add_w=w(len(add)),
        rem_src=[a for a, _ in rem], rem_dst=[b for _, b in rem],
    )  # fmt: skip


def check(g, edit, **kw):
    before = (g.indptr.copy(), g.indices.copy(), None if g.weights is None else g.weights.copy())
    assert g.max_degree >= 0  # memoized: the edit carries it over unless the largest row shrank
    eff = apply_edit(g, edit, **kw)
    want = reference(g, edit)
    assert_same_graph(eff.graph, want)
    true_max = int(np.diff(want.indptr).max()) if want.num_nodes else 0
    assert eff.graph.cache().get("max_degree", true_max) == true_max
    assert eff.graph.max_degree == true_max
    np.testing.assert_array_equal(eff.changed_rows, changed_reference(g, eff.graph))
    np.testing.assert_array_equal(eff.new_ids, np.arange(g.num_nodes, g.num_nodes + edit.new_count))
    assert eff.graph is not g
    np.testing.assert_array_equal(g.indptr, before[0])  # the input is untouched
    np.testing.assert_array_equal(g.indices, before[1])
    if before[2] is not None:
        np.testing.assert_array_equal(g.weights, before[2])
    return eff


# ============================================================================ equality with a rebuild
@pytest.mark.parametrize("weighted", [False, True])
def test_random_edits_match_rebuild(weighted):
    rng = np.random.default_rng(11 + weighted)
    for trial in range(60):
        g = sym_graph(rng, int(rng.integers(2, 40)), int(rng.integers(0, 120)), weighted=weighted)
        check(g, random_edit(rng, g, weights=["mixed", "ones"][trial % 2]))


def test_sequences_of_edits_match_rebuild():
    rng = np.random.default_rng(5)
    g = sym_graph(rng, 60, 300, weighted=False)
    assert not g.is_weighted
    for _ in range(40):
        eff = check(g, random_edit(rng, g, weights="ones"))
        assert not eff.graph.is_weighted  # every weight 1: stays unweighted
        g = eff.graph
    eff = check(g, random_edit(rng, g, max_new=0, max_rem=0, max_add=3, weights="mixed"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 25),
    e=st.integers(0, 80),
    seed=st.integers(0, 2**32 - 1),
    weighted=st.booleans(),
    loops=st.booleans(),
)
def test_hypothesis_edits_match_rebuild(n, e, seed, weighted, loops):
    rng = np.random.default_rng(seed)
    g = sym_graph(rng, n, e, weighted=weighted, loops=loops)
    edit = random_edit(rng, g, loops=loops)
    check(g, edit, allow_self_loops=loops)


def test_new_nodes_link_each_other_and_old_nodes():
    g = CSRGraph.from_edge_index(np.array([[0, 1, 1, 2], [1, 0, 2, 1]]), num_nodes=4)
    edit = GraphEdit.make(new_count=2, new_ptr=[0, 2, 4], new_nbrs=[0, 3, 4, 1], new_weights=[1, 1, 1, 1])
    eff = check(g, edit)
    assert list(eff.graph.neighbors(4)) == [0, 3, 5]
    assert list(eff.graph.neighbors(5)) == [1, 4]
    assert list(eff.graph.neighbors(3)) == [4]
    np.testing.assert_array_equal(eff.changed_rows, [0, 1, 3, 4, 5])
    assert not eff.graph.is_weighted
    lonely = check(g, GraphEdit.make(new_count=1))  # a new node without edges
    assert lonely.graph.num_nodes == 5 and lonely.graph.degrees[4] == 0
    np.testing.assert_array_equal(lonely.changed_rows, [4])


def test_remove_then_add_reweights_in_one_edit():
    g = CSRGraph.from_edge_index(np.array([[0, 1, 1, 2], [1, 0, 2, 1]]), num_nodes=3)
    eff = check(g, GraphEdit.make(rem_src=[1], rem_dst=[0], add_src=[0], add_dst=[1], add_w=[2.0]))
    assert eff.graph.is_weighted
    np.testing.assert_array_equal(eff.graph.weights, [2.0, 2.0, 1.0, 1.0])
    np.testing.assert_array_equal(eff.changed_rows, [0, 1])
    same = check(g, GraphEdit.make(rem_src=[0], rem_dst=[1], add_src=[1], add_dst=[0]))  # same weight back
    assert same.changed_rows.size == 0 and not same.graph.is_weighted
    # a removal may take an edge a new node of the same edit brought
    eff = check(g, GraphEdit.make(new_count=1, new_ptr=[0, 2], new_nbrs=[0, 2], rem_src=[3], rem_dst=[2]))
    assert list(eff.graph.neighbors(3)) == [0]


def test_unweighted_graph_materialises_weights_when_needed():
    g = CSRGraph.from_edge_index(np.array([[0, 1], [1, 0]]), num_nodes=3)
    eff = check(g, GraphEdit.make(add_src=[1], add_dst=[2], add_w=[0.5]))
    np.testing.assert_array_equal(eff.graph.weights, [1.0, 1.0, 0.5, 0.5])
    zero = check(g, GraphEdit.make(add_src=[1], add_dst=[2], add_w=[0.0]))  # 0 is a weight, kept as from_edge_index does
    assert zero.graph.is_weighted and zero.graph.num_edges == 4
    # a new node's edges follow the same rule: 0 is a weight
    zero = check(g, GraphEdit.make(new_count=1, new_ptr=[0, 2], new_nbrs=[0, 2], new_weights=[0.0, 1.0]))
    assert list(zero.graph.neighbors(3)) == [0, 2] and zero.graph.weights[zero.graph.indptr[3]] == 0.0


def test_index_dtype_follows_node_count():
    g = CSRGraph.from_edge_index(np.array([[0, 1], [1, 0]]), num_nodes=2)
    eff = apply_edit(g, GraphEdit.make(new_count=1, new_ptr=[0, 1], new_nbrs=[0]))
    assert eff.graph.indices.dtype == np.int32


def test_empty_edit():
    g = CSRGraph.from_edge_index(np.array([[0, 1], [1, 0]]), num_nodes=2)
    assert GraphEdit.make().empty and GraphEdit().empty
    assert not GraphEdit.make(new_count=1).empty
    eff = check(g, GraphEdit.make())
    assert eff.changed_rows.size == 0 and eff.new_ids.size == 0


# ============================================================================ validation
@pytest.fixture
def small():
    # 40 nodes, a path 0-1-...-39 plus the edge (5, 9)
    src = [*range(39), 5]
    dst = [*range(1, 40), 9]
    return CSRGraph.from_edge_index(np.array([src, dst]), num_nodes=40, symmetrize=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(new_count=2, new_ptr=[0, 1, 1], new_nbrs=[0], add_src=[0, 1, 99], add_dst=[3, 3, 2]),
         "add_edges[2]: node 99 is not in the graph (0 .. 41 after this update's 2 new nodes)"),
        (dict(add_src=[0], add_dst=[-1]), "add_edges[0]: node -1 is not in the graph (0 .. 39)"),
        (dict(rem_src=[0, 1, 2, 5], rem_dst=[1, 2, 3, 10]), "remove_edges[3]: edge (5, 10) does not exist"),
        (dict(rem_src=[0, 40], rem_dst=[1, 1]), "remove_edges[1]: node 40 is not in the graph (0 .. 39)"),
        (dict(rem_src=[5, 9], rem_dst=[9, 5]), "remove_edges[1]: edge (9, 5) is removed twice (also remove_edges[0])"),
        (dict(add_src=[5], add_dst=[9]), "add_edges[0]: edge (5, 9) already exists"),
        (dict(add_src=[2, 7], add_dst=[7, 2]), "add_edges[1]: edge (7, 2) is added twice (also add_edges[0])"),
        (dict(add_src=[3], add_dst=[3]), "add_edges[0]: self-loop (3, 3) is not allowed"),
        # the request's field (UpdateGraph's add_edges), not the kernel's array
        (dict(add_src=[0, 3], add_dst=[7, 8], add_w=[1.0, -2.0]),
         "add_edges[1]: weight -2.0 of edge (3, 8) must be finite and >= 0"),
        (dict(add_src=[0], add_dst=[7], add_w=[np.nan]), "add_edges[0]: weight nan"),
        (dict(new_count=1, new_ptr=[0, 2], new_nbrs=[3, 3]), "new_nbrs[1]: new node 40 lists neighbour 3 twice"),
        (dict(new_count=2, new_ptr=[0, 1, 2], new_nbrs=[3, 41]), "new_nbrs[1]: new node 41"),
        (dict(new_count=1, new_ptr=[0, 1], new_nbrs=[3], new_weights=[np.inf]), "new_weights[0]: weight inf"),
        (dict(rem_src=[0], rem_dst=[2], add_src=[0], add_dst=[1]), "remove_edges[0]: edge (0, 2) does not exist"),
    ],
)
def test_invalid_edits_name_the_entry_and_change_nothing(small, kwargs, message):
    before = small.indices.copy()
    with pytest.raises(GraphEditError) as exc:
        apply_edit(small, GraphEdit.make(**kwargs))
    assert message in str(exc.value)
    np.testing.assert_array_equal(small.indices, before)


def test_removed_edge_can_be_readded_but_existing_cannot(small):
    check(small, GraphEdit.make(rem_src=[5], rem_dst=[9], add_src=[9], add_dst=[5], add_w=[3.0]))
    with pytest.raises(GraphEditError, match=r"add_edges\[0\]: edge \(9, 5\) already exists"):
        apply_edit(small, GraphEdit.make(rem_src=[0], rem_dst=[1], add_src=[9], add_dst=[5]))


def test_self_loops(small):
    eff = check(small, GraphEdit.make(add_src=[3], add_dst=[3], add_w=[2.0]), allow_self_loops=True)
    assert list(eff.graph.neighbors(3)) == [2, 3, 4]
    # that graph has a self-loop now: by default another is allowed, and the loop can go again
    eff2 = check(eff.graph, GraphEdit.make(add_src=[7], add_dst=[7], rem_src=[3], rem_dst=[3]))
    assert list(eff2.graph.neighbors(3)) == [2, 4]
    with pytest.raises(GraphEditError, match="self-loop"):
        apply_edit(eff.graph, GraphEdit.make(add_src=[7], add_dst=[7]), allow_self_loops=False)
    # the self-loop count travels with the edited graphs: eff2 still has one (7, 7), then none
    eff3 = check(eff2.graph, GraphEdit.make(rem_src=[7], rem_dst=[7]))
    with pytest.raises(GraphEditError, match="the graph has none"):
        apply_edit(eff3.graph, GraphEdit.make(add_src=[1], add_dst=[1]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(add_src=[1, 2], add_dst=[3]), "add_src has 2 entries, add_dst 1"),
        (dict(add_src=[1], add_dst=[3], add_w=[1, 2]), "add_w has 2 entries"),
        (dict(rem_src=[1], rem_dst=[]), "rem_src has 1 entries, rem_dst 0"),
        (dict(new_count=2, new_ptr=[0, 1], new_nbrs=[1]), "new_ptr must have new_count + 1 = 3 entries"),
        (dict(new_count=1, new_ptr=[0, 2], new_nbrs=[1]), "new_ptr must run from 0 to len(new_nbrs) = 1"),
        (dict(new_count=2, new_ptr=[0, 2, 1], new_nbrs=[1]), "new_ptr[2]: 1 is below new_ptr[1] = 2"),
        (dict(new_count=1, new_nbrs=[1]), "no new_ptr"),
        (dict(new_count=1, new_ptr=[0, 1], new_nbrs=[1], new_weights=[1, 1]), "new_weights has 2 entries"),
        (dict(new_count=-1), "new_count must be an integer >= 0"),
        (dict(add_src=[0.5], add_dst=[1]), "add_src must hold integer node ids"),
    ],
)
def test_make_rejects_ragged_input(kwargs, message):
    with pytest.raises(GraphEditError) as exc:
        GraphEdit.make(**kwargs)
    assert message in str(exc.value)


def test_make_normalises_dtypes():
    e = GraphEdit.make(add_src=np.array([1], np.int32), add_dst=[2.0], add_w=[1], rem_src=(), rem_dst=())
    assert e.add_src.dtype == e.add_dst.dtype == np.int64 and e.add_w.dtype == np.float32
    assert e.rem_src.dtype == np.int64 and e.new_ptr.tolist() == [0]
    p = edit_from_pairs(add=[(1, 2), (3, 4)], remove=[(0, 1)])
    assert p.add_dst.tolist() == [2, 4] and p.rem_src.tolist() == [0]


# ============================================================================ cost shape
class _SortSpy:
    """Stands in for numpy inside kernels.graph_edit and records the largest array sorted."""

    def __init__(self):
        self.largest = 0

    def __getattr__(self, name):
        fn = getattr(np, name)
        if name in ("argsort", "sort", "unique", "lexsort"):
            def spy(a, *args, **kw):
                self.largest = max(self.largest, int(np.size(a)))
                return fn(a, *args, **kw)
            return spy
        return fn


def test_single_edge_edit_on_a_large_graph_sorts_only_the_touched_rows(monkeypatch):
    rng = np.random.default_rng(0)
    g = sym_graph(rng, 20_000, 250_000, weighted=False)  # ~500k directed edges
    assert g.num_edges > 450_000
    spy = _SortSpy()
    monkeypatch.setattr(ge, "np", spy)
    u, v = 17, 12345
    assert v not in set(g.neighbors(u).tolist())
    eff = apply_edit(g, GraphEdit.make(add_src=[u], add_dst=[v]))
    assert spy.largest < 200, spy.largest  # degrees of the two rows, not E
    monkeypatch.undo()
    assert eff.graph.num_edges == g.num_edges + 2
    np.testing.assert_array_equal(eff.changed_rows, [u, v])
    assert_same_graph(eff.graph, reference(g, GraphEdit.make(add_src=[u], add_dst=[v])))


def benchmark(num_nodes: int = 13_752, num_edges: int = 250_000, repeats: int = 50) -> float:
    """Mean seconds of a one-edge addition + removal on a random graph (not a test; no asserts)."""
    import time

    rng = np.random.default_rng(0)
    g = sym_graph(rng, num_nodes, num_edges, weighted=False)
    apply_edit(g, edit_from_pairs(add=[(0, 1)]) if 1 not in g.neighbors(0) else GraphEdit.make())  # compile
    t0 = time.perf_counter()
    for _ in range(repeats):
        u, v = (int(x) for x in rng.integers(num_nodes, size=2))
        if u == v or v in g.neighbors(u):
            continue
        g2 = apply_edit(g, edit_from_pairs(add=[(u, v)])).graph
        apply_edit(g2, edit_from_pairs(remove=[(u, v)]))
    return (time.perf_counter() - t0) / (2 * repeats)


if __name__ == "__main__":
    print(f"one-edge edit: {benchmark() * 1e3:.2f} ms")


def test_an_edit_carries_the_idle_scratch_arrays_and_what_the_new_graph_answers_is_unchanged():
    """The subgraph kernels' scratch arrays (tagged [N] int64) move to the edited graph, new nodes
    included, so its first batch allocates nothing; scopes on the new graph equal those on a fresh copy
    of it (the tags left by the old graph's calls are stale by their epoch)."""
    from kernels.subgraph import _SCRATCH_KEY, lhop_nodes

    rng = np.random.default_rng(3)
    g = sym_graph(rng, 50, 150, weighted=False)
    lhop_nodes(g, np.arange(10), 2)  # leaves one idle scratch array in g's pool
    (sc,) = g.cache()[_SCRATCH_KEY]
    g2 = apply_edit(g, GraphEdit.make(new_count=2, new_ptr=[0, 1, 3], new_nbrs=[0, 1, 50],
                                      add_src=[2], add_dst=[49])).graph
    assert g2.cache()[_SCRATCH_KEY] == [sc] and g.cache()[_SCRATCH_KEY] == []
    fresh = CSRGraph(g2.indptr.copy(), g2.indices.copy(), None, g2.num_nodes)
    for targets in (np.arange(52), np.array([51, 0, 2, 49])):
        got, want = lhop_nodes(g2, targets, 2), lhop_nodes(fresh, targets, 2)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    assert g2.cache()[_SCRATCH_KEY] == [sc]  # used and given back
    big = apply_edit(g2, GraphEdit.make(new_count=2000, new_ptr=np.zeros(2001, np.int64))).graph
    assert _SCRATCH_KEY not in big.cache() and g2.cache()[_SCRATCH_KEY] == [sc]  # too small: stays


# ============================================================================ recycled buffers
@pytest.fixture
def pool(monkeypatch):
    """Every array an edit writes goes through a fresh pool (the process's skips arrays under 64 MiB)."""
    p = ge.RecycledBuffers(min_bytes=1)
    monkeypatch.setattr(ge, "BUFFERS", p)
    return p


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("weighted", [False, True])
def test_an_edit_reuses_only_arrays_nothing_references(pool, weighted):
    """A chain of edits matches rebuilds while its arrays are recycled; an array still reachable in any way (its
    graph, a slice of it, a tensor sharing it) is never written, and once nothing reaches it the next edit writes
    into it instead of allocating."""
    import torch

    rng = np.random.default_rng(3 + weighted)
    g = sym_graph(rng, 80, 400, weighted=weighted)
    g1 = check(g, random_edit(rng, g, weights="mixed" if weighted else "ones")).graph
    g2 = check(g1, random_edit(rng, g1, weights="mixed" if weighted else "ones")).graph
    assert pool.reused == 0  # g1 is alive: nothing idle yet
    keep = g1.indices[5:60]  # a view: the buffer stays reachable after its graph is gone
    held = torch.from_numpy(g1.indptr)
    keep_vals, held_vals, old = keep.copy(), held.clone(), _address(g1.indices)
    del g1
    g3 = check(g2, random_edit(rng, g2, weights="mixed" if weighted else "ones")).graph
    assert not np.shares_memory(g3.indices, keep) and not np.shares_memory(g3.indptr, held.numpy())
    np.testing.assert_array_equal(keep, keep_vals)
    assert torch.equal(held, held_vals)
    del keep, held
    g4 = check(g3, random_edit(rng, g3, weights="mixed" if weighted else "ones")).graph
    assert _address(g4.indices) == old and pool.reused >= 2  # g1's indices and indptr, now unreachable
    for _ in range(20):  # a longer chain: each version checked against a rebuild, arrays going round
        g4 = check(g4, random_edit(rng, g4, weights="mixed" if weighted else "ones")).graph
    assert pool.reused > 20 and pool.allocated <= 9 + 3 * 2
    used, idle = pool.held_bytes()
    assert used >= g4.indices.nbytes and idle > 0


def test_idle_buffers_are_released_after_a_quiet_while(pool):
    rng = np.random.default_rng(1)
    g = sym_graph(rng, 50, 200, weighted=False)
    for _ in range(4):
        g = apply_edit(g, random_edit(rng, g, weights="ones")).graph
    used, idle = pool.held_bytes()
    assert idle > 0
    assert pool.release_idle() == 0  # edits came just now
    pool.idle_s = 0.0
    assert pool.release_idle() == idle
    assert pool.held_bytes() == (used, 0)
    want = reference(g, edit := random_edit(rng, g, weights="ones"))
    g2 = apply_edit(g, edit).graph  # g's arrays were kept (g reads them): this edit allocated afresh
    assert_same_graph(g2, want)
    assert pool.release_idle(force=True) == 0  # g and g2 both alive
    del g
    assert pool.release_idle(force=True) > 0 and pool.held_bytes()[1] == 0
    assert pool.held_bytes()[0] >= g2.indices.nbytes


def test_arrays_below_the_threshold_are_left_to_the_allocator():
    p = ge.RecycledBuffers()
    a = p.take(1000, np.int32)
    assert a.base is None and p.allocated == 0 and p.held_bytes() == (0, 0)
    big = p.take((64 << 20) // 4, np.int32)
    assert len(big) == (64 << 20) // 4 and big.base is not None and p.allocated == 1
    del big
    assert p.held_bytes()[1] > 0 and p.release_idle(force=True) > 0
