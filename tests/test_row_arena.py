"""kernels.row_arena.RowArena (a replica's stored rows end to end) and RedisGraphStore.rows_csr through it: the rows
it gives equal the graph's, in any order and repeated adds; a full arena takes no more and says so; threads adding
and reading at once see whole rows (the store's side: tests/test_stateless.py, rows_csr through the arena)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kernels.graph import CSRGraph
from kernels.row_arena import RowArena


def _graph(weighted: bool, n: int = 400, seed: int = 0) -> CSRGraph:
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, size=(2, 6 * n))
    w = (rng.random(ei.shape[1]) + 0.1).astype(np.float32) if weighted else None
    return CSRGraph.from_edge_index(ei, n, w, symmetrize=True)


def _rows(g: CSRGraph, ids: np.ndarray):
    lens = (g.indptr[ids + 1] - g.indptr[ids]).astype(np.int64)
    cols = np.concatenate([g.indices[g.indptr[v]:g.indptr[v + 1]] for v in ids]) if len(ids) else np.zeros(0, np.int32)
    ws = (np.concatenate([g.weights[g.indptr[v]:g.indptr[v + 1]] for v in ids]) if len(ids) else np.zeros(0, np.float32)) \
        if g.weights is not None else None
    return lens, cols, ws


@pytest.mark.parametrize("weighted", [False, True])
def test_rows_come_back_as_added_in_any_order(weighted):
    g = _graph(weighted)
    rng = np.random.default_rng(1)
    arena = RowArena(g.num_nodes, 1 << 20, weighted)
    assert arena.gather(np.array([3])) is None  # nothing held
    first = rng.choice(g.num_nodes, 150, replace=False)
    assert arena.add(first, *_rows(g, first)) == 150
    again = np.concatenate([first[:50], rng.choice(g.num_nodes, 60, replace=False)])
    again = np.unique(again)
    held = arena.add(again, *_rows(g, again))  # rows held already are skipped, the others added
    assert held == len(np.union1d(first, again))
    for ids in (first[::-1].copy(), np.union1d(first, again), np.array([], dtype=np.int64)):
        ptr, cols, ws = arena.gather(ids)
        lens, want, want_w = _rows(g, ids)
        np.testing.assert_array_equal(np.diff(ptr), lens)
        np.testing.assert_array_equal(cols, want)
        assert cols.dtype == np.int64
        if weighted:
            np.testing.assert_array_equal(ws, want_w.astype(np.float64))
        else:
            assert ws is None
    missing = np.setdiff1d(np.arange(g.num_nodes), np.union1d(first, again))
    np.testing.assert_array_equal(arena.missing(np.arange(g.num_nodes)), missing)
    assert arena.gather(np.array([int(first[0]), int(missing[0])])) is None


def test_a_full_arena_takes_no_more_rows():
    g = _graph(False)
    deg = np.diff(g.indptr)
    arena = RowArena(g.num_nodes, RowArena.INDEX_BYTES * g.num_nodes + 4 * int(deg[:10].sum()), False)
    ids = np.arange(20)
    assert arena.add(ids, *_rows(g, ids)) == 10 and arena.full  # the first ten fit, the eleventh does not
    assert arena.add(np.array([50]), *_rows(g, np.array([50]))) == 10
    np.testing.assert_array_equal(arena.gather(np.arange(10))[1], _rows(g, np.arange(10))[1])
    assert arena.gather(np.array([10])) is None
    assert arena.nbytes <= arena.budget
    assert RowArena.fits(1000, 48_000) and not RowArena.fits(1000, 47_999) and not RowArena.fits(0, 1 << 20)


def test_add_checks_its_arrays():
    arena = RowArena(10, 1 << 16, True)
    with pytest.raises(ValueError, match="lengths adding up"):
        arena.add(np.array([1]), np.array([2]), np.array([3]), np.ones(1, np.float32))
    with pytest.raises(ValueError, match="one weight per column"):
        arena.add(np.array([1]), np.array([1]), np.array([3]))


def test_threads_adding_and_reading_see_whole_rows():
    g = _graph(True, n=2000, seed=3)
    arena = RowArena(g.num_nodes, 1 << 22, True)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(60):
                ids = np.unique(rng.choice(g.num_nodes, 40))
                arena.add(ids, *_rows(g, ids))
                got = arena.gather(ids)
                assert got is not None
                _, cols, ws = _rows(g, ids)
                np.testing.assert_array_equal(got[1], cols)
                np.testing.assert_array_equal(got[2], ws.astype(np.float64))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
