"""An adversarial review of 3bfb8b7..c27ef9a (a request's new nodes: rows in global order, parallel new-node pushes,
existing and new nodes in one SDK/CLI call, serve's flag checks in one place).

Two sections: the bugs it found (each test failed on the reviewed code and passes on the fix: a pool swap that failed
a concurrent call, a worker error raised before the other workers ended, an empty new-node list refused, a chunked
call's error naming a new node by its index in its request, one scratch more pooled than the memory estimate counts,
the estimate taking the parent's threads for --processes children, pushes failing once interpreter shutdown began)
and behaviour checked and found correct where the existing tests did not cover it."""

from __future__ import annotations

import io
import json
import threading
import time

import numpy as np
import pytest

from kernels.datasets import synthetic_sbm
from kernels.graph import CSRGraph
from kernels.ppr import PPRConfig, ppr_new_node, ppr_topk

SHADOW, GCN = "shadow", "gcn"

pytest_plugins = ("tests.redis_server",)


@pytest.fixture(scope="module")
def sbm_graph():
    return synthetic_sbm(300, num_classes=3, avg_degree=8, num_features=2, seed=1).graph


def _equal_lists(got, want) -> None:
    assert len(got) == len(want)
    for i, ((a, sa), (b, sb)) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"node {i}")
        np.testing.assert_array_equal(sa, sb, err_msg=f"node {i}")


# =============================================================================================== found, fixed
def test_a_growing_pool_never_fails_a_concurrent_call(sbm_graph, monkeypatch):
    """Found by the review, fixed since; as found: kernels.ppr_push._new_node_pool replaces the shared pool by a larger one and shuts the old one down
    (shutdown(wait=False)); a caller that fetched the old pool just before, and submits after, gets
    ``RuntimeError: cannot schedule new futures after shutdown``: a Predict fails whenever two model workers push
    batches of different sizes while the pool grows (on a machine with more than 2 numba threads, the first batches
    of growing sizes). Made deterministic here by pausing the smaller call between fetching the pool and
    submitting; without the pause 28 of 200 rounds of 4 concurrent callers failed on the 2-vCPU VM."""
    import kernels.ppr_push as pp

    size = int(pp._NEW_NODE_POOL[1])  # whatever earlier tests grew it to: both calls below need more
    small_threads, big_threads = size + 2, size + 4
    nodes = [(np.array([1 + i, 40 + i]), None) for i in range(big_threads)]
    real = pp._new_node_pool
    got_small, grown = threading.Event(), threading.Event()

    def paused(workers):
        pool = real(workers)
        if threading.current_thread().name == "review-small":
            got_small.set()
            grown.wait(10)  # the bigger call replaces the pool meanwhile
        else:
            grown.set()
        return pool

    monkeypatch.setattr(pp, "_new_node_pool", paused)
    errors: list[BaseException] = []
    out: dict = {}

    def small():
        try:
            out["small"] = pp.ppr_new_nodes(sbm_graph, nodes[:small_threads], PPRConfig(), threads=small_threads)
        except BaseException as exc:  # the point of the test
            errors.append(exc)

    t = threading.Thread(target=small, name="review-small")
    t.start()
    assert got_small.wait(10)
    pp.ppr_new_nodes(sbm_graph, nodes, PPRConfig(), threads=big_threads)
    t.join(30)
    assert not errors, f"a concurrent ppr_new_nodes failed: {errors[0]!r}"
    _equal_lists(out["small"], [ppr_new_node(sbm_graph, nb, w, PPRConfig()) for nb, w in nodes[:small_threads]])


def test_a_worker_error_returns_after_every_worker(sbm_graph, monkeypatch):
    """Found by the review, fixed since; as found: ppr_new_nodes' ``finally: for f in futures: f.result()`` stops at the first worker's error: the call raises
    while later workers still push (and still hold their scratches), against its own comment ("every worker's
    scratch back in the pool, and its error raised, before returning"). The fix: concurrent.futures.wait(futures)
    first, then raise the first error."""
    import kernels.ppr_push as pp

    nodes = [(np.array([1 + i]), None) for i in range(3)]
    pp.ppr_new_nodes(sbm_graph, nodes, PPRConfig(), threads=3)  # compiled / cache loaded before the timing matters
    real = pp._ppr_virtual_dense
    finished = threading.Event()

    def flaky(indptr, indices, gw, wdeg, uniq, *rest):
        v = int(uniq[0])
        if v == 2:  # the second node (worker 1) fails at once
            raise MemoryError("review: a worker's push failed")
        if v == 3:  # the third node (worker 2) is slow
            time.sleep(0.5)
            res = real(indptr, indices, gw, wdeg, uniq, *rest)
            finished.set()
            return res
        return real(indptr, indices, gw, wdeg, uniq, *rest)

    monkeypatch.setattr(pp, "_ppr_virtual_dense", flaky)
    with pytest.raises(MemoryError):
        pp.ppr_new_nodes(sbm_graph, nodes, PPRConfig(), threads=3)
    still_running = not finished.is_set()
    finished.wait(5)
    assert not still_running, "ppr_new_nodes raised before its other workers had finished"


def test_sdk_predict_with_an_empty_new_nodes_list(served, tiny_dataset):
    """Found by the review, fixed since; as found: GnnClient.predict(model, nodes, new_nodes=[]) (a list of new nodes that happens to be empty) raises
    InvalidArgumentError "neighbors is required (the new node's edges to existing node ids)": new_node_messages([])
    takes an empty list for raw features. It should mean "no new nodes" (as None does). The fix, in client.py / aio.py:
    ``msgs = new_node_messages(new_nodes) if new_nodes is not None and not _empty(new_nodes) else []`` (or make
    new_node_messages return [] for an empty sequence)."""
    from clients import GnnClient

    with GnnClient(served.address, timeout=120) as c:
        want = c.predict(GCN, [3, 9], sampling_width=0)
        got = c.predict(GCN, [3, 9], new_nodes=[], sampling_width=0)
    assert got.labels.tolist() == want.labels.tolist() and got.num_new_nodes == 0


def test_a_chunked_new_node_error_names_its_index_in_the_call(served, tiny_dataset):
    """Found by the review, fixed since; as found: A bad new node in a call split into several requests (max_nodes_per_call, or the server's per-request
    limit) is refused by the server under its index in *its request*: the 5th new node of the call (index 4) is
    reported as ``new_nodes[0]`` when the call goes out 2 new nodes at a time. `gnnserve predict --new-nodes FILE`
    users are pointed at the wrong entry of their file. The fix: PredictPlan remembers each request's first new-node
    index and the client rewrites ``new_nodes[i]`` in an INVALID_ARGUMENT (or checks the feature count against
    GetModel's num_features before sending)."""
    from clients import GnnClient, InvalidArgumentError, NewNode

    g, x = tiny_dataset.graph, np.asarray(tiny_dataset.x)
    new = [NewNode(x[v], g.indices[g.indptr[v]:g.indptr[v + 1]]) for v in (5, 17, 123, 200, 300)]
    new[4] = NewNode(x[300][:3], [1, 2])  # 3 features instead of the model's 16
    with GnnClient(served.address, timeout=120) as c:
        with pytest.raises(InvalidArgumentError) as whole:
            c.predict(GCN, [1], new_nodes=new, sampling_width=0)
    assert "new_nodes[4]" in whole.value.details  # one request for the new nodes: right
    with GnnClient(served.address, timeout=120, max_nodes_per_call=2) as c:
        with pytest.raises(InvalidArgumentError) as chunked:
            c.predict(GCN, [1], new_nodes=new, sampling_width=0)
    assert "new_nodes[4]" in chunked.value.details, chunked.value.details


def test_the_pool_keeps_no_more_new_node_scratches_than_the_estimate_counts(sbm_graph, monkeypatch):
    """Found by the review, fixed since; as found: serve/memory_budget.py counts new_node_workers(N, many) one-worker scratches per graph, but ppr_new_nodes
    gives its scratches back with keep=workers + 1: after two overlapping batches the graph's pool holds
    workers + 1 of them for good (one 40 x (N + 1) bytes more than estimated: 160 MiB on a 4 M-node graph). Fix:
    keep=workers in ppr_new_nodes, or count workers + 1 in the estimate."""
    import kernels.ppr_push as pp

    g = CSRGraph(indptr=sbm_graph.indptr, indices=sbm_graph.indices, num_nodes=sbm_graph.num_nodes)
    threads = 2
    if int(pp._NEW_NODE_POOL[1]) < threads - 1:
        pp._new_node_pool(threads - 1)
    real = pp._take_dense
    gate = threading.Barrier(3, timeout=20)  # two callers and the first one's pool worker hold scratches at once
    calls = []

    def overlapping(graph, *a, **kw):
        sc = real(graph, *a, **kw)
        calls.append(1)
        if len(calls) <= 3:
            gate.wait()
        return sc

    monkeypatch.setattr(pp, "_take_dense", overlapping)
    nodes = [(np.array([1 + i]), None) for i in range(threads)]
    ts = [threading.Thread(target=pp.ppr_new_nodes, args=(g, nodes, PPRConfig()), kwargs={"threads": threads})
          for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    kept = sum(sc.threads == 1 for sc in g.cache()[pp._SCRATCH_KEY])
    counted = pp.new_node_workers(g.num_nodes, 1 << 30, threads)  # what memory_budget.estimate counts
    assert kept <= counted, f"{kept} one-worker scratches kept for good, the memory estimate counts {counted}"


def test_the_memory_estimate_uses_the_childrens_threads_under_processes(tmp_path):
    """Found by the review, fixed since; as found: With --processes P the estimate multiplies every term by P, but counts each child's new-node workers with
    the *parent's* numba thread count; serve.processes.child_env gives each child max(1, cores // P) numba threads
    (NUMBA_NUM_THREADS), so each child pushes on fewer workers. The estimate overcounts (a conservative error that
    can refuse to start a configuration that fits). The fix: in estimate(), pass threads=child share when
    processes > 1 (as child_env computes it, unless NUMBA_NUM_THREADS is set)."""
    import argparse
    import os

    from kernels.ppr_push import new_node_workers
    from kernels.threads import numba_threads
    from serve.memory_budget import estimate

    procs = 2
    cores = len(os.sched_getaffinity(0))
    share = int(os.environ.get("NUMBA_NUM_THREADS", max(1, cores // procs)))
    n = 100_000
    if new_node_workers(n, 1 << 30, share) == new_node_workers(n, 1 << 30, numba_threads()):
        pytest.skip("the children's numba share gives as many workers as the parent's count here")
    d = tmp_path / "repo" / "s" / "1"
    d.mkdir(parents=True)
    ds = {"name": "x", "num_nodes": n, "num_edges": 10 * n, "num_features": 8, "graph_fingerprint": "fp"}
    d.joinpath("config.json").write_text(json.dumps({"dataset": ds, "extractor": "ppr",
                                                      "ppr": {"topk": 16, "eps": 1e-4}, "model": {"hidden": 8}}))
    args = argparse.Namespace(repo=str(tmp_path / "repo"), graph=None, features="memory", hot_bytes=0,
                              projection_cache_bytes=2 << 30, activation_cache_bytes=256 << 20,
                              induced_table_bytes=1 << 30, graph_cache_bytes=64 << 20, processes=procs)
    state = [b for w, b in estimate(args).items if w.startswith("PPR push state for new nodes")]
    assert state == [procs * new_node_workers(n, 1 << 30, share) * 40 * (n + 1)], state


def test_new_nodes_pushed_once_interpreter_shutdown_began():
    """Found by the review, fixed since; as found: ppr_new_nodes submits to a concurrent.futures pool, which refuses new work once the interpreter's shutdown
    began (threading's atexit hooks run before atexit's): a call from an atexit handler, e.g. a BackgroundServer
    stopped there with requests still draining, raises RuntimeError where ppr_new_node (one thread) answered.
    The fix: on RuntimeError from submit (shut down pool or interpreter), push the remaining parts on the calling
    thread."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import atexit, numpy as np\n"
        "from kernels.ppr import PPRConfig, ppr_new_nodes\n"
        "from kernels.datasets import synthetic_sbm\n"
        "g = synthetic_sbm(300, num_classes=3, avg_degree=8, num_features=2, seed=1).graph\n"
        "nodes = [(np.array([1 + i]), None) for i in range(3)]\n"
        "ppr_new_nodes(g, nodes, PPRConfig(), threads=3)\n"
        "def late():\n"
        "    try:\n"
        "        ppr_new_nodes(g, nodes, PPRConfig(), threads=3)\n"
        "        print('LATE OK')\n"
        "    except Exception as e:\n"
        "        print('LATE FAILED', repr(e))\n"
        "atexit.register(late)\n"
    )
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "LATE OK" in proc.stdout, proc.stdout


# ==================================================================================== pinned behaviour
def _global_order_spec(batch):
    g = batch.graph
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    order = np.lexsort((batch.node_ids[g.indices], rows))
    return rows, g.indices[order], None if g.weights is None else g.weights[order]


@pytest.mark.parametrize("weighted", [False, True])
def test_in_global_order_with_repeated_ids_hubs_and_repeated_extra_edges(weighted):
    """Lists with repeated ids (existing and virtual; induced_batch gives a repeated id edges only into its last
    occurrence, so no row holds one global id twice), a hub (binary-search rows), a single-row list, a virtual
    node whose extra edges repeat a neighbour, on an int64-indexed graph too: the lexsort's columns and weights."""
    from kernels.subgraph import ExtraEdges, in_global_order, induced_batch

    rng = np.random.default_rng(5 + weighted)
    n = 2000
    star = np.stack([np.zeros(n - 1, dtype=np.int64), np.arange(1, n)])
    ei = np.concatenate([star, rng.integers(0, n, size=(2, 8000))], axis=1)
    w = rng.uniform(0.1, 3.0, size=ei.shape[1]) if weighted else None
    g32 = CSRGraph.from_edge_index(ei, num_nodes=n, weights=w, symmetrize=True)
    g64 = CSRGraph(indptr=g32.indptr, indices=g32.indices.astype(np.int64), weights=g32.weights, num_nodes=n)
    nb = rng.choice(n, 20, replace=False)
    nb = np.concatenate([nb, nb[:5]])
    ew = rng.uniform(0.1, 2.0, size=2 * len(nb)).astype(np.float32) if weighted else None
    extra = ExtraEdges.from_edges(n, np.concatenate([np.full(len(nb), n), nb]),
                                  np.concatenate([nb, np.full(len(nb), n)]), ew, num_virtual=1)
    lists = [np.concatenate([[0], rng.integers(0, n, 60), [0, 0]]),
             np.concatenate([[n], nb, rng.integers(0, n, 40), [n], nb[:3]]),
             np.array([0]), np.array([n]), rng.integers(0, n, 300)]
    ptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    nodes = np.concatenate(lists).astype(np.int64)
    for g in (g32, g64):
        batch = induced_batch(g, ptr, nodes, extra=extra)
        rows, cols, ws = _global_order_spec(batch)
        key = rows * (n + 1) + batch.node_ids[batch.graph.indices]
        assert len(np.unique(key)) == len(key)  # no global id twice in a row: the order is well defined
        got = in_global_order(batch)
        np.testing.assert_array_equal(got.graph.indices, cols)
        assert got.graph.indices.dtype == batch.graph.indices.dtype
        if weighted:
            np.testing.assert_array_equal(got.graph.weights, ws)
        else:
            assert got.graph.weights is None


def test_in_global_order_compiles_only_the_shipped_signature():
    """Batches from induced_batch on int32- and int64-indexed graphs, weighted or not, with and without virtual
    nodes, reach _global_order_kernel with one signature, the one kernels/precompile.tsv ships (no compile on the
    request path)."""
    from pathlib import Path

    from kernels.subgraph import ExtraEdges, _global_order_kernel, in_global_order, induced_batch

    rng = np.random.default_rng(2)
    n = 200
    ei = rng.integers(0, n, size=(2, 1500))
    for weighted in (False, True):
        g = CSRGraph.from_edge_index(ei, num_nodes=n, weights=rng.uniform(0.1, 2, 1500) if weighted else None,
                                     symmetrize=True)
        for gg in (g, CSRGraph(indptr=g.indptr, indices=g.indices.astype(np.int64), weights=g.weights,
                               num_nodes=n)):
            extra = ExtraEdges.from_edges(n, np.array([n, n, 4, 9]), np.array([4, 9, n, n]), None, num_virtual=1)
            ptr = np.array([0, 30, 45], dtype=np.int64)
            nodes = np.concatenate([rng.choice(n, 30, replace=False), [n, 4, 9], rng.choice(n, 12)]).astype(np.int64)
            in_global_order(induced_batch(gg, ptr, nodes, extra=extra))
    shipped = {line.split("\t")[2] for line in (Path(__file__).resolve().parent.parent / "kernels" /
                                                 "precompile.tsv").read_text().splitlines()
               if line.startswith("kernels.subgraph\t_global_order_kernel\t")}
    assert {str(s) for s in _global_order_kernel.signatures} <= shipped


def test_replica_batch_reaches_the_shipped_global_order_signature(redis_factory):
    """A replica's induced batch (serve.graph.store RedisGraphStore.induced_batch: a local graph from Redis rows)
    with new nodes' extra edges, put in global order as ModelRuntime._subgraphs does: the lexsort's order, the
    shipped signature only, and gcn_degrees carried by the caller."""
    from pathlib import Path

    from kernels.subgraph import ExtraEdges, _global_order_kernel, in_global_order, induced_batch

    from .test_replica_exact import Mirror, _ring_and_random, _store_of

    n, edges = _ring_and_random(True, 3)
    g = Mirror(n, edges, True).graph()
    with _store_of(redis_factory, g, PPRConfig(topk=16), "review-go") as store:
        extra = ExtraEdges.from_edges(n, np.array([n, n, 5, 77]), np.array([5, 77, n, n]),
                                      np.array([0.5, 2.0, 0.5, 2.0], np.float32), num_virtual=1)
        ptr = np.array([0, 12, 17], dtype=np.int64)
        nodes = np.concatenate([np.arange(0, 12), [n, 5, 77, 6, 4]]).astype(np.int64)
        remote = store.induced_batch(ptr, nodes, extra=extra)
        local = induced_batch(g, ptr, nodes, extra=extra)
        got = in_global_order(remote)
        _, cols, ws = _global_order_spec(remote)
        np.testing.assert_array_equal(got.graph.indices, cols)
        np.testing.assert_array_equal(got.graph.weights, ws)
        # the same global columns per row as the graph in memory
        want = in_global_order(local)
        np.testing.assert_array_equal(remote.node_ids[got.graph.indices], local.node_ids[want.graph.indices])
        np.testing.assert_array_equal(got.graph.weights, want.graph.weights)
    shipped = {line.split("\t")[2] for line in (Path(__file__).resolve().parent.parent / "kernels" /
                                                 "precompile.tsv").read_text().splitlines()
               if line.startswith("kernels.subgraph\t_global_order_kernel\t")}
    assert {str(s) for s in _global_order_kernel.signatures} <= shipped


def test_new_nodes_keep_the_batch_push_scratch_pooled(sbm_graph):
    """After a parallel new-node batch, ppr_topk (a batch push, numba_threads() workers) still finds its own scratch
    in the graph's pool instead of allocating threads x N x 40 bytes per call. At c27ef9a the new nodes' one-worker
    scratches filled the pool (keep=workers + 1) and the batch push's keep=2 dropped its scratch on every call;
    a9aad20 (the pool keeps 2 scratches per number of workers) fixed it; this pins the fix."""
    import kernels.ppr_push as pp
    from kernels.threads import numba_threads

    if numba_threads() < 2:
        pytest.skip("the batch push's scratch is a one-worker one here")
    g = CSRGraph(indptr=sbm_graph.indptr, indices=sbm_graph.indices, num_nodes=sbm_graph.num_nodes)  # own cache
    cfg = PPRConfig()
    ppr_topk(g, [1, 2], cfg)
    batch = [sc for sc in g.cache()[pp._SCRATCH_KEY] if sc.threads > 1]
    assert len(batch) == 1
    pp.ppr_new_nodes(g, [([1, 2], None), ([3], None), ([4], None)], cfg, threads=3)
    for _ in range(3):
        ppr_topk(g, [1, 2], cfg)
        assert any(sc is batch[0] for sc in g.cache()[pp._SCRATCH_KEY]), "the batch push's scratch was dropped"


def test_new_nodes_all_equal_when_a_live_scratch_with_spare_room_is_pooled(sbm_graph):
    """A one-worker scratch with spare capacity (what kernels.ppr_live carries to a grown graph) in the pool:
    ppr_new_nodes' workers take it and the others fresh ones; every list equals ppr_new_node's on a fresh graph, and
    the pooled scratches come back with the thresholds they had (the virtual node's and neighbours' restored)."""
    import kernels.ppr_push as pp

    g = CSRGraph(indptr=sbm_graph.indptr, indices=sbm_graph.indices, num_nodes=sbm_graph.num_nodes)
    cfg = PPRConfig(eps=1e-4, topk=24)
    spare = pp._DenseScratch(pp._weighted_degree(g), 1, cfg.eps, capacity=g.num_nodes + 50)
    before = spare.rw.copy()
    pp._give_dense(g, spare)
    rng = np.random.default_rng(4)
    nodes = [(rng.choice(g.num_nodes, int(rng.integers(0, 5)), replace=False), None) for _ in range(7)]
    got = pp.ppr_new_nodes(g, nodes, cfg, threads=3)
    fresh = CSRGraph(indptr=sbm_graph.indptr, indices=sbm_graph.indices, num_nodes=sbm_graph.num_nodes)
    _equal_lists(got, [ppr_new_node(fresh, nb, w, cfg) for nb, w in nodes])
    assert any(sc is spare for sc in g.cache()[pp._SCRATCH_KEY])
    np.testing.assert_array_equal(spare.rw, before)
    assert not spare.p.any()


def test_raw_request_with_duplicates_and_new_nodes_and_concurrent_mixed_requests(served, tiny_dataset):
    """The server's side of a mixed Predict (the SDK never sends one: it sends existing and new nodes in separate
    requests): one request holding repeated existing ids and new nodes answers each row as the separate calls do,
    and several such requests at once (batched together by the server) each get their own rows."""
    from clients import GnnClient, NewNode
    from clients._gen import gnnserve_pb2 as pb

    from .test_client_server import raw_arrays, raw_predict

    g, x = tiny_dataset.graph, np.asarray(tiny_dataset.x)
    picks = [5, 17, 123, 400]
    new = [pb.NewNode(features=x[v].tolist(), neighbors=g.indices[g.indptr[v]:g.indptr[v + 1]].tolist())
           for v in picks]
    with GnnClient(served.address, timeout=120) as c:
        for model in (GCN, SHADOW):
            ids = [3, 9, 3, 3, 700]
            want_old = c.predict(model, ids, sampling_width=0).labels.tolist()
            want_new = c.predict_new_node(model, [NewNode(x[v], g.indices[g.indptr[v]:g.indptr[v + 1]])
                                                  for v in picks], sampling_width=0).labels.tolist()
            labels, probs = raw_arrays(raw_predict(served.address, model=model, nodes=ids, new_nodes=new,
                                                   sampling_width=0, return_probabilities=True))
            assert labels.tolist() == want_old + want_new
            assert np.allclose(probs.sum(1), 1.0, atol=1e-4)
            results: dict = {}
            batched: list[int] = []

            def send(i, model=model, ids=ids, results=results, batched=batched, want_old=want_old, want_new=want_new):
                sub_ids, sub_new = ids[i:] + ids[:i], new[i % 4:] + new[: i % 4]
                resp = raw_predict(served.address, model=model, nodes=sub_ids, new_nodes=sub_new, sampling_width=0,
                                   return_probabilities=True)
                labels, _ = raw_arrays(resp)
                batched.append(int(resp.timing.batch_size))
                results[i] = (labels.tolist(), want_old[i:] + want_old[:i] + want_new[i % 4:] + want_new[: i % 4])

            ts = [threading.Thread(target=send, args=(i,)) for i in range(6)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(120)
            assert len(results) == 6
            print(model, "batch sizes of the concurrent requests", batched)
            for i, (got, want) in results.items():
                assert got == want, (model, i)


def test_one_node_per_call_with_both_kinds(served, tiny_dataset):
    """max_nodes_per_call=1 with existing and new nodes: one request per row, the rows in order, edges summed."""
    from clients import GnnClient, NewNode

    g, x = tiny_dataset.graph, np.asarray(tiny_dataset.x)
    new = [NewNode(x[v], g.indices[g.indptr[v]:g.indptr[v + 1]]) for v in (5, 17)]
    with GnnClient(served.address, timeout=120) as c:
        ref = c.predict(SHADOW, [3, 9, 3], new_nodes=new, sampling_width=0)
    with GnnClient(served.address, timeout=120, max_nodes_per_call=1) as c:
        one = c.predict(SHADOW, [3, 9, 3], new_nodes=new, sampling_width=0)
    assert one.timing.chunks == 5 and one.labels.tolist() == ref.labels.tolist()
    assert one.nodes.tolist() == [3, 9, 3] and one.num_new_nodes == 2
    np.testing.assert_allclose(one.probabilities, ref.probabilities, atol=1e-5)


def test_cli_new_nodes_hostile_inputs(served, tiny_dataset, capsys, tmp_path, monkeypatch):
    """gnnserve predict --new-nodes: NaN / Infinity / 1e400 features (JSON that Python parses) and a neighbour out of
    range or repeated are refused by the server as one INVALID_ARGUMENT line, exit 2; empty stdin is a usage error;
    the table prints existing rows then new[i] rows."""
    from serve.cli import main

    addr = served.address
    x = np.asarray(tiny_dataset.x)
    n = tiny_dataset.num_nodes
    good = {"features": x[5].tolist(), "neighbors": [1, 2]}
    f = tmp_path / "new.jsonl"
    for text, msg in (
        (json.dumps(good).replace(json.dumps(x[5].tolist()[0]), "NaN", 1), "new_nodes[0]"),
        (json.dumps(good).replace(json.dumps(x[5].tolist()[0]), "Infinity", 1), "new_nodes[0]"),
        (json.dumps(good).replace(json.dumps(x[5].tolist()[0]), "1e400", 1), "new_nodes[0]"),
        (json.dumps({**good, "neighbors": [1, n]}), "neighbour"),
        (json.dumps({**good, "neighbors": [1, 1]}), "repeat"),
        (json.dumps({**good, "features": [1.0, 2.0]}), "features must have 16"),
    ):
        f.write_text(text + "\n")
        rc = main(["predict", "--server", addr, "--model", GCN, "--nodes", "3", "--new-nodes", str(f)])
        cap = capsys.readouterr()
        err = cap.err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and msg in err[0] and "Traceback" not in cap.err, (text[:60], err)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    rc = main(["predict", "--server", addr, "--model", GCN, "--new-nodes", "-"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "<stdin>: no new nodes in it" in err[0], err
    f.write_text(json.dumps(good) + "\n" + json.dumps({**good, "neighbors": []}) + "\n")
    rc = main(["predict", "--server", addr, "--model", GCN, "--nodes", "3,3", "--new-nodes", str(f), "--width", "0"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0 and "nodes 4" in out[0]
    assert [row.split()[0] for row in out[2:6]] == ["3", "3", "new[0]", "new[1]"]


@pytest.mark.parametrize(("flags", "msg"), [
    (["--blas-threads", "-1"], "--blas-threads must be >= 0 (0: leave the BLAS pools as they are), got -1"),
    (["--gpu-min-targets", "-1"], "--gpu-min-targets must be >= 0 (0: every batch on the GPU), got -1"),
    (["--fused-head"], "--fused-head is a kernel for models resident on the GPU"),
    (["--fused-shadow", "--device", "cuda", "--no-resident"], "--fused-shadow is a kernel for models resident"),
    (["--serving-path", "shadow-resident", "--no-resident"], "--serving-path shadow-resident needs the resident"),
    (["--processes", "-3", "--blas-threads", "-1"], "--processes must be >= 1, got -3"),
])
def test_serve_moved_flag_checks_not_covered_yet(tmp_path, capsys, flags, msg):
    """The checks moved into _flag_problem that tests/test_cli_errors.py does not exercise: one line, exit 2, before
    the repository is even looked at (a missing one here)."""
    from serve.cli import main

    rc = main(["serve", "--repo", str(tmp_path / "missing"), "--port", "0", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"gnnserve serve: {msg}"), err


def test_serve_flag_defaults_pass_the_checks():
    """Every default of gnnserve serve (None for the optional ones) passes _flag_problem."""
    import argparse

    from serve import cli

    captured = {}
    real = argparse.ArgumentParser.parse_args

    def grab(self, args=None, namespace=None):
        ns = real(self, args, namespace)
        captured["ns"] = ns
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = grab
    try:
        with pytest.raises(SystemExit):
            cli._serve(["--repo", "/nonexistent"])
    finally:
        argparse.ArgumentParser.parse_args = real
    assert cli._flag_problem(captured["ns"]) is None
