"""Issue 23, the Redis parts: a hostile (or careless) client of the data store cannot hurt the server.

Against a real ``redis-server`` (tests/redis_server.py), real trained models (``tiny_repo``) and a
real gRPC server on loopback (tests/serving.py):

* features / graph versions are chosen by the model's dataset fingerprint, never another
  dataset's ``current`` version;
* versions are pinned by number *and* content digest: a version deleted and re-loaded with other
  content under the pinned number is refused (DATA_LOSS), never mixed with cached rows;
* responses echo the data version used (``PredictResponse.data_version``, the SDK's result);
* re-running ``graph load`` / ``features load`` on a live version never takes it offline;
* client-facing UNAVAILABLE / DATA_LOSS messages hold no Redis host, port, user or driver text;
* a loader that lost its lock stops writing;
* ``gnnserve serve --hot-bytes`` builds the static hot tier from the model's PPR index.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import grpc
import numpy as np
import pytest

from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg

from .serving import ServerProcess, ServerThread, free_port

pytest_plugins = ("tests.redis_server",)

#: every request fetches its features: no projection / activation cache in front of the store
NO_CACHES = {"projection_budget_bytes": 0, "activation_budget_bytes": 0}
FAST = {"socket_timeout": 0.5, "connect_timeout": 0.5, "retries": 1, "backoff_base": 0.01, "backoff_cap": 0.05}
NODES = [0, 5, 17, 99, 250, 401, 640, 799]


@pytest.fixture(scope="module")
def other_dataset(tiny_dataset):
    """The same graph (same graph fingerprint) with other features: another dataset."""
    x = np.random.default_rng(23).standard_normal(tiny_dataset.x.shape).astype(np.float32) * 3
    other = dataclasses.replace(tiny_dataset, x=x, name="other")
    assert other.graph.fingerprint() == tiny_dataset.graph.fingerprint()
    assert other.fingerprint() != tiny_dataset.fingerprint()
    return other


def predict(address, model, nodes, timeout=60, **kw):
    with grpc.insecure_channel(address) as ch:
        return pbg.GnnServiceStub(ch).Predict(
            pb.PredictRequest(model=model, nodes=list(map(int, nodes)), return_probabilities=True, **kw),
            timeout=timeout)


def predict_error(address, model, nodes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        predict(address, model, nodes)
    return ei.value


def assert_no_infrastructure(details: str, srv) -> None:
    """No host, port, socket path, URL, user, password or driver exception text in a client message."""
    for secret in ("127.0.0.1", str(srv.port), srv.socket_path, "redis://", "unix://", "***",
                   "ConnectionError", "TimeoutError", "Errno", "default@"):
        assert secret not in details, (secret, details)
    if srv.password:
        assert srv.password not in details


def meta_of(srv, key: str) -> dict[str, str]:
    cl = srv.client()
    try:
        return {k.decode(): v.decode() for k, v in cl.hgetall(key).items()}
    finally:
        cl.close()


def feature_meta(srv, dataset, version: int) -> dict[str, str]:
    from serve.features.redis_store import FeatureKeys

    return meta_of(srv, FeatureKeys(dataset.graph.fingerprint(), version).meta)


# =========================================================================== 1. another dataset's data
def test_redis_features_of_another_dataset_are_not_served(redis_factory, tiny_repo, tiny_dataset, other_dataset,
                                                          served, caplog):
    """``current`` names features of another dataset: the server uses the newest live version of
    the model's dataset (and says so in the log and in every response), or refuses the model."""
    from clients import GnnClient
    from serve.features import delete_features, load_features

    srv = redis_factory()
    load_features(tiny_dataset, srv.url, version=1, progress=False)
    load_features(other_dataset, srv.url, version=2, progress=False)  # a new load: current -> v2
    cl = srv.client()
    assert cl.get(f"gnnserve:feat:{tiny_dataset.graph.fingerprint()}:current") == b"2"
    cl.close()
    want_version = f"features:v1:{feature_meta(srv, tiny_dataset, 1)['checksum']}"

    caplog.set_level(logging.WARNING, logger="serve.features.redis_store")
    server = ServerThread(tiny_repo, {"feature_url": srv.url, "runtime_kw": NO_CACHES}).start()
    try:
        for model in ("shadow", "gcn"):
            want = predict(served.address, model, NODES)
            got = predict(server.address, model, NODES)
            assert list(got.labels) == list(want.labels)
            np.testing.assert_allclose(got.probabilities, want.probabilities, rtol=1e-4, atol=1e-5)
            assert got.data_version == want_version
        assert predict(served.address, "gcn", NODES).data_version == f"memory:{tiny_dataset.fingerprint()}"
        with GnnClient(server.address) as client:  # the SDK result carries it too
            res = client.predict("gcn", NODES)
            assert res.data_version == want_version and res.to_dict()["data_version"] == want_version
        assert any("current version v2 was not loaded from dataset" in r.getMessage() for r in caplog.records)
    finally:
        server.stop()

    # only the other dataset's features left: the model is refused, with the reason in the log
    delete_features(srv.url, tiny_dataset.graph.fingerprint(), 1)
    server = ServerThread(tiny_repo, {"feature_url": srv.url, "runtime_kw": NO_CACHES}).start()
    try:
        err = predict_error(server.address, "gcn", NODES)
        # refused at load for a cause retrying cannot mend (Redis lacks this dataset's features): not retried
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err
        reasons = " ".join(server.server.registry.failures().values())
        assert f"holds dataset {tiny_dataset.fingerprint()}" in reasons, reasons
    finally:
        server.stop()


def test_stateless_replica_uses_the_graph_and_features_of_its_dataset(redis_factory, tiny_repo, tiny_dataset,
                                                                      other_dataset, served, tmp_path):
    """Stateless mode: ``current`` graph and feature versions hold another dataset; the replica
    serves the versions of its own dataset and echoes both."""
    from serve.features import load_features
    from serve.graph_store import GraphKeys, load_graph

    from .test_stateless import models_only, repo_ppr_configs

    srv = redis_factory()
    cfgs = repo_ppr_configs(tiny_repo)
    load_features(tiny_dataset, srv.url, version=1, progress=False)
    load_graph(tiny_dataset, srv.url, version=1, ppr=cfgs, ppr_cache_dir=str(tiny_repo / "_ppr"), progress=False)
    load_features(other_dataset, srv.url, version=2, progress=False)
    load_graph(other_dataset, srv.url, version=2, ppr=cfgs, ppr_cache_dir=str(tiny_repo / "_ppr"), progress=False)
    gck = meta_of(srv, GraphKeys(tiny_dataset.graph.fingerprint(), 1).meta)["checksum"]
    fck = feature_meta(srv, tiny_dataset, 1)["checksum"]

    repo = models_only(tiny_repo, tmp_path / "repo")
    server = ServerThread(repo, {"runtime_kw": {"graph_url": srv.url, **NO_CACHES}}).start()
    try:
        for model in ("shadow", "gcn"):
            want = predict(served.address, model, NODES)
            got = predict(server.address, model, NODES)
            assert list(got.labels) == list(want.labels)
            np.testing.assert_allclose(got.probabilities, want.probabilities, rtol=1e-4, atol=1e-5)
            assert got.data_version == f"features:v1:{fck};graph:v1:{gck}"
    finally:
        server.stop()


# =========================================================================== 1. pinned by content
def test_a_version_reloaded_under_the_pinned_number_is_refused_never_mixed(redis_factory, tiny_repo, tiny_dataset,
                                                                           other_dataset, caplog):
    """Delete v1 and load other features as v1 while a server holds rows of the old v1 in its cache:
    requests that need a fetch fail DATA_LOSS (never old cached rows next to new fetched ones),
    requests answered from the cache fail too once the background check saw it; loading the old
    content again (same digest) heals it."""
    from serve.features import delete_features, load_features

    srv = redis_factory()
    load_features(tiny_dataset, srv.url, version=1, progress=False)
    ck = feature_meta(srv, tiny_dataset, 1)["checksum"]
    fp = tiny_dataset.graph.fingerprint()
    opts = {"cache_bytes": 400 * 16 * 4, "watch_interval": 0.1, **FAST}  # an LRU of 400 rows: half the graph
    server = ServerThread(tiny_repo, {"feature_url": srv.url, "feature_options": opts, "runtime_kw": NO_CACHES}).start()
    try:
        cached = [0, 1, 2, 3]
        first = predict(server.address, "gcn", cached)
        assert first.data_version == f"features:v1:{ck}"

        delete_features(srv.url, fp, 1)
        load_features(other_dataset, srv.url, version=1, progress=False)
        assert feature_meta(srv, tiny_dataset, 1)["checksum"] != ck
        caplog.set_level(logging.WARNING)
        err = predict_error(server.address, "gcn", [790, 791, 792, 793])  # not cached: fetched from the new v1
        assert err.code() == grpc.StatusCode.DATA_LOSS, err.details()
        assert "deleted or replaced" in err.details() and "reload the model" in err.details()
        assert_no_infrastructure(err.details(), srv)
        assert any(f"pinned at open time with digest {ck}" in r.getMessage() for r in caplog.records)

        deadline = time.monotonic() + 10  # the cached rows: refused once the background check ran
        while True:
            try:
                predict(server.address, "gcn", cached)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.DATA_LOSS, exc.details()
                break
            assert time.monotonic() < deadline, "answers from the old version's cache after it was replaced"
            time.sleep(0.05)

        delete_features(srv.url, fp, 1)  # the original content back under v1: same digest, served again
        load_features(tiny_dataset, srv.url, version=1, progress=False)
        assert feature_meta(srv, tiny_dataset, 1)["checksum"] == ck
        deadline = time.monotonic() + 10  # healed at the next background check
        while True:
            try:
                again = predict(server.address, "gcn", cached)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.DATA_LOSS and time.monotonic() < deadline, exc.details()
                time.sleep(0.05)
        assert list(again.labels) == list(first.labels) and again.data_version == first.data_version
        predict(server.address, "gcn", [790, 791, 792, 793])
    finally:
        server.stop()


def test_feature_store_pin_is_checked_on_every_fetch(redis_factory, tiny_dataset, other_dataset):
    from serve.features import DataVersionChanged, RedisFeatureStore, delete_features, load_features

    srv = redis_factory()
    fp = tiny_dataset.graph.fingerprint()
    load_features(tiny_dataset, srv.url, version=1, progress=False)
    store = RedisFeatureStore(srv.url, fp, registry=None, watch_interval=0, **FAST)
    try:
        np.testing.assert_array_equal(store.get([1, 2]), tiny_dataset.x[[1, 2]])
        delete_features(srv.url, fp, 1)
        load_features(other_dataset, srv.url, version=1, progress=False, max_chunks=0)  # re-load started: loading
        with pytest.raises(DataVersionChanged, match="being re-loaded"):
            store.get([1, 2])
        load_features(other_dataset, srv.url, version=1, progress=False, overwrite=True)  # finished: other digest
        with pytest.raises(DataVersionChanged, match="other content"):
            store.get([1, 2])
        with pytest.raises(DataVersionChanged):
            _ = store.data_version
    finally:
        store.close()


def test_graph_store_pins_its_version_by_checksum(redis_factory, tiny_repo, tiny_dataset):
    from serve.features import DataVersionChanged
    from serve.graph_store import GraphKeys, RedisGraphStore, load_graph

    from .test_stateless import repo_ppr_configs

    srv = redis_factory()
    g = tiny_dataset.graph
    load_graph(tiny_dataset, srv.url, version=1, progress=False)
    store = RedisGraphStore(srv.url, g.fingerprint(), watch_interval=0)
    try:
        ck = store.digest
        assert store.data_version == f"graph:v1:{ck}"
        store.adjacency(np.array([1, 2, 3]))
        cl = srv.client()
        cl.delete(GraphKeys(g.fingerprint(), 1).meta)  # the version deleted, loaded again with other content
        cl.close()
        load_graph(tiny_dataset, srv.url, version=1, ppr=repo_ppr_configs(tiny_repo),
                   ppr_cache_dir=str(tiny_repo / "_ppr"), progress=False)
        with pytest.raises(DataVersionChanged, match="other content"):
            store.adjacency(np.array([4, 5]))
        with pytest.raises(DataVersionChanged):
            store.check_version()
    finally:
        store.close()


# =========================================================================== 2. re-running a load
def _cmdstats(srv) -> dict[str, int]:
    cl = srv.client()
    try:
        return {k: int(v["calls"]) for k, v in cl.info("commandstats").items()}
    finally:
        cl.close()


def test_rerunning_graph_load_on_a_live_version_writes_nothing_and_stays_live(redis_factory, tiny_dataset,
                                                                              other_dataset):
    from serve.graph_store import GraphCorrupt, GraphKeys, load_graph

    srv = redis_factory()
    first = load_graph(tiny_dataset, srv.url, version=1, progress=False, chunk_size=64)
    key = GraphKeys(tiny_dataset.graph.fingerprint(), 1).meta
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:  # what a replica starting now would see
        cl = srv.client()
        while not stop.is_set():
            seen.add((cl.hget(key, "state") or b"?").decode())
        cl.close()

    t = threading.Thread(target=watch)
    before = _cmdstats(srv)
    t.start()
    try:
        again = load_graph(tiny_dataset, srv.url, version=1, progress=False, chunk_size=64)
    finally:
        stop.set()
        t.join()
    after = _cmdstats(srv)
    assert seen == {"live"}
    for cmd in ("cmdstat_mset", "cmdstat_hset", "cmdstat_set", "cmdstat_sadd", "cmdstat_del"):
        assert after.get(cmd, 0) == before.get(cmd, 0), cmd  # nothing written
    assert again.already_live and again.checksum == first.checksum and again.keys_written == 0

    with pytest.raises(GraphCorrupt, match="live with other content"):  # another dataset under v1: refused
        load_graph(other_dataset, srv.url, version=1, progress=False)
    meta = meta_of(srv, key)
    assert meta["state"] == "live" and meta["checksum"] == first.checksum


def test_rerunning_features_load_on_a_live_version_keeps_it_live(redis_factory, tiny_dataset):
    from serve.features import RedisFeatureStore, load_features
    from serve.features.redis_store import FeatureKeys

    srv = redis_factory()
    first = load_features(tiny_dataset, srv.url, version=1, progress=False, chunk_size=100)
    keys = FeatureKeys(tiny_dataset.graph.fingerprint(), 1)
    cl = srv.client()
    cl.delete(keys.chunks)  # lost progress records: a re-run rewrites chunks of the live version

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        load_features(tiny_dataset, srv.url, version=1, progress=False, chunk_size=100, progress_callback=interrupt)
    meta = feature_meta(srv, tiny_dataset, 1)
    assert meta["state"] == "live" and meta["checksum"] == first.verify.checksum
    assert cl.get(keys.current) == b"1"
    cl.close()
    store = RedisFeatureStore(srv.url, keys.fingerprint, registry=None, watch_interval=0)  # a new replica opens it
    try:
        np.testing.assert_array_equal(store.get(np.arange(800)), tiny_dataset.x)
    finally:
        store.close()


# =========================================================================== 3. client-facing messages
def test_store_errors_reach_clients_without_infrastructure_details(redis_factory, tiny_repo, tiny_dataset, caplog):
    from serve.features import load_features

    srv = redis_factory(password="s3cr-et_pw")
    load_features(tiny_dataset, srv.url, version=1, progress=False)
    caplog.set_level(logging.WARNING)
    server = ServerThread(tiny_repo, {"feature_url": srv.url, "feature_options": FAST, "runtime_kw": NO_CACHES}).start()
    try:
        predict(server.address, "gcn", NODES)
        srv.stop()
        err = predict_error(server.address, "gcn", NODES)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        d = err.details()
        assert "feature store (Redis) is unavailable" in d and "retry" in d and "the server log has the details" in d
        assert_no_infrastructure(d, srv)
        ref = d.rsplit("(", 1)[1].split(":")[0]  # "incident <id>": the log line with the details names it
        logged = [r.getMessage() for r in caplog.records if ref in r.getMessage()]
        assert logged and f"127.0.0.1:{srv.port}" in logged[0] and "s3cr-et_pw" not in logged[0]
    finally:
        server.stop()


def test_status_for_maps_store_errors_without_their_text():
    from serve.errors import status_for
    from serve.features import DataVersionChanged, FeatureCorrupt, FeatureNotFound, FeatureUnavailable
    from serve.graph_store import GraphUnavailable

    text = "fetching 3 rows: Redis at redis://bob:***@10.1.2.3:6380/0 unavailable (ConnectionError: refused)"
    cases = [(FeatureUnavailable(text), grpc.StatusCode.UNAVAILABLE, "feature store (Redis) is unavailable"),
             (GraphUnavailable(text), grpc.StatusCode.UNAVAILABLE, "graph store (Redis) is unavailable"),
             (FeatureCorrupt(text), grpc.StatusCode.DATA_LOSS, "feature data failed its checks"),
             (FeatureNotFound(text), grpc.StatusCode.UNAVAILABLE, "missing from the store"),
             (DataVersionChanged(text), grpc.StatusCode.DATA_LOSS, "deleted or replaced")]
    for exc, code, phrase in cases:
        got_code, msg = status_for(exc)
        assert got_code == code and phrase in msg, msg
        for leak in ("10.1.2.3", "6380", "bob", "redis://", "ConnectionError"):
            assert leak not in msg
    assert "(request r-7:" in status_for(FeatureUnavailable(text), request_id="r-7")[1]
    exc = FeatureUnavailable(text)
    exc.request_id = "req-42"  # type: ignore[attr-defined]
    assert "(request req-42:" in status_for(exc)[1]


# =========================================================================== 4. the loader's lock
def test_a_loader_that_lost_its_lock_stops_writing(redis_factory, tiny_dataset):
    """Loader A stalls past its lock's TTL and loader B takes the lock: A must stop, not write on
    (nor extend B's lock); B finishes the load, verified and live."""
    from serve.features import FeatureLoadError, load_features
    from serve.features.redis_store import FeatureKeys

    srv = redis_factory()
    keys = FeatureKeys(tiny_dataset.graph.fingerprint(), 1)
    b_has_lock, a_done = threading.Event(), threading.Event()
    b_result: list = []
    a_chunks: list[int] = []

    def b_callback(done: int, total: int) -> None:
        b_has_lock.set()
        assert a_done.wait(60)

    def run_b() -> None:
        try:
            b_result.append(load_features(tiny_dataset, srv.url, version=1, chunk_size=100, progress=False,
                                          progress_callback=b_callback))
        except BaseException as exc:  # reported by the assertion below
            b_result.append(exc)

    def a_callback(done: int, total: int) -> None:
        a_chunks.append(done)
        if done == 2:  # A stalls: its lock expires and B takes it
            cl = srv.client()
            cl.pexpire(keys.lock, 1)
            time.sleep(0.05)
            cl.close()
            threading.Thread(target=run_b, daemon=True).start()
            assert b_has_lock.wait(60)

    cl = srv.client()
    try:
        with pytest.raises(FeatureLoadError, match="lost its lock"):
            load_features(tiny_dataset, srv.url, version=1, chunk_size=100, progress=False,
                          progress_callback=a_callback)
        assert a_chunks == [1, 2]  # A wrote nothing after it lost the lock
        ttl = cl.pttl(keys.lock)
        assert ttl > 0 and cl.get(keys.lock) is not None  # B's lock is still there (A did not delete it)
    finally:
        a_done.set()
    deadline = time.monotonic() + 60
    while not b_result and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b_result and not isinstance(b_result[0], BaseException), b_result
    assert b_result[0].state == "live" and b_result[0].verify.ok
    cl.close()


# =========================================================================== 5. --hot-bytes
def _hot_bytes(metrics_port: int) -> float:
    from .serving import metric_samples

    return sum(v for labels, v in metric_samples(metrics_port, "gnnserve_feature_cache_bytes")
               if labels.get("tier") == "hot")


def test_serve_hot_bytes_builds_the_static_hot_tier_from_the_ppr_index(redis_factory, tiny_repo, tiny_dataset,
                                                                       served):
    from serve.features import load_features

    srv = redis_factory()
    load_features(tiny_dataset, srv.url, version=1, progress=False)
    budget = 200 * 16 * 4  # 200 rows: 150 hot (--hot-fraction 0.75 by default), 50 LRU
    mport = free_port()
    proc = ServerProcess(tiny_repo, "--features", srv.url, "--hot-bytes", str(budget), "--metrics-port", str(mport),
                         "--projection-cache-bytes", "0", "--activation-cache-bytes", "0")
    proc.start()
    try:
        assert _hot_bytes(mport) == 150 * 16 * 4, proc.log()
        log = proc.log()
        assert "static hot tier of 150 rows installed" in log, log
        for model in ("shadow", "gcn"):  # and the answers are those of the in-memory server
            want = predict(served.address, model, NODES)
            got = predict(proc.address, model, NODES)
            assert list(got.labels) == list(want.labels)
            np.testing.assert_allclose(got.probabilities, want.probabilities, rtol=1e-4, atol=1e-5)
    finally:
        proc.terminate()


def test_install_hot_from_index_ranks_the_ppr_index(redis_factory, tiny_repo, tiny_dataset):
    """The tier ``--hot-bytes`` installs holds the nodes most frequent in the PPR top-K lists."""
    from kernels.ppr import PPRIndex
    from serve.features import (
        RedisFeatureStore,
        hot_set_from_index,
        install_hot_from_index,
        load_features,
        open_store,
    )

    from .test_stateless import repo_ppr_configs

    srv = redis_factory()
    load_features(tiny_dataset, srv.url, version=1, progress=False)
    idx = PPRIndex.open_or_build(tiny_repo / "_ppr", tiny_dataset.graph, repo_ppr_configs(tiny_repo)[0])
    store = open_store(srv.url, dataset=tiny_dataset, hot="ppr", cache_bytes=100 * 16 * 4, hot_fraction=0.5,
                       registry=None)
    try:
        assert store.stats()["hot_rows"] == 0
        assert install_hot_from_index(store, idx) == 50
        want = hot_set_from_index(idx.ptr, idx.nodes, tiny_dataset.num_nodes)[:50]
        np.testing.assert_array_equal(store.hot_ids, want)
        assert store.stats()["hot_filled"] == 50 and store.stats()["lru_rows"] == 50
        assert install_hot_from_index(store, idx) == 0  # once per store
        np.testing.assert_array_equal(store.get(want), tiny_dataset.x[want])
        assert isinstance(store.backend, RedisFeatureStore)
    finally:
        store.close()


def test_version_pin_check_semantics():
    """``None`` (metadata gone) passes, ``""`` (a re-load running) and another digest raise and are
    remembered; an unreachable metadata master (cluster) relies on the last check."""
    from serve.features import DataVersionChanged
    from serve.features.redis_store import DIGEST_UNREACHABLE, VersionPin, parse_redis_url

    pin = VersionPin(None, parse_redis_url("redis://u:pw@10.0.0.9:6390/0"), "m", kind="features", version=3,
                     digest="abc")
    assert pin.label == "features:v3:abc"
    pin.check("abc")
    pin.check(None)
    pin.check(DIGEST_UNREACHABLE)
    for found in ("", "def"):
        with pytest.raises(DataVersionChanged) as ei:
            pin.check(found)
        assert ei.value.pinned == "abc" and ei.value.found == found and "pw" not in str(ei.value)
    with pytest.raises(DataVersionChanged):
        pin.check(DIGEST_UNREACHABLE)  # the last check saw a change
    with pytest.raises(DataVersionChanged):
        pin.raise_if_changed()
    pin.check("abc")  # the pinned content is back
    pin.raise_if_changed()
    pin.check(DIGEST_UNREACHABLE)
