"""The Redis feature store, loader and tiered cache against a real ``redis-server``.

Servers come from ``tests/redis_server.py`` (loaded as a pytest plugin): one shared plain server for
the session, private
ones (``redis_factory``) for tests that stop, kill, freeze or password-protect theirs, and a
3-master Redis Cluster. Every client has short socket timeouts and bounded retries, and every test
has a timeout, so a broken server fails a test instead of hanging the run.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from serve.features import (
    FeatureCorrupt,
    FeatureLoadError,
    FeatureNotFound,
    FeatureUnavailable,
    RedisFeatureStore,
    TieredFeatureStore,
    delete_features,
    list_versions,
    load_features,
    open_store,
    verify_features,
)
from serve.features.redis_store import BlobCodec, FeatureKeys

# the fixtures redis_server, redis_factory and redis_cluster (one registration for the whole session)
pytest_plugins = ("tests.redis_server",)

pytestmark = pytest.mark.timeout(60)

N, F = 700, 16
FAST = {"socket_timeout": 0.3, "connect_timeout": 0.3, "retries": 1, "backoff_base": 0.01, "backoff_cap": 0.05}


def _features(seed: int, n: int = N, f: int = F) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, f)).astype(np.float32)


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return _features(11)


@pytest.fixture(scope="module")
def loaded(redis_server, x):
    """``x`` loaded as graph "fpA" v1 on the shared server (chunks of 128 nodes)."""
    rep = load_features(x, redis_server.url, version=1, chunk_size=128, progress=False, fingerprint="fpA")
    assert rep.state == "live" and rep.verify is not None and rep.verify.ok
    return redis_server


def _key(fp: str, version: int, node: int) -> bytes:
    return FeatureKeys(fp, version).node_key(node)


# --------------------------------------------------------------------------- equality with memory
@pytest.mark.parametrize("which", ["tcp", "unix"])
def test_redis_store_equals_memory_for_random_ids_with_duplicates(loaded, x, which):
    url = loaded.url if which == "tcp" else loaded.unix_url
    store = RedisFeatureStore(url, "fpA", 1, chunk_size=64, registry=None, **FAST)
    assert (store.num_nodes, store.num_features, store.dtype) == (N, F, np.float32)
    rng = np.random.default_rng(0)
    for size in (1, 37, 400, 2000):  # 2000 ids: several pipelined MGET chunks, many duplicates
        ids = rng.integers(0, N, size)
        out = store.get(ids)
        assert out.dtype == np.float32 and out.shape == (size, F)
        np.testing.assert_array_equal(out, x[ids])
    assert store.get([]).shape == (0, F)
    s = store.stats()
    assert s["calls"] == 5 and s["rows"] == 2438 and s["unique_rows"] < s["rows"] and s["hiredis"]
    assert store.ping()
    store.close()
    with pytest.raises(FeatureUnavailable):
        store.get([1])


def test_float16_encoding_round_trip(loaded, x):
    rep = load_features(x, loaded.url, version=2, chunk_size=256, progress=False, fingerprint="fp16", dtype="float16")
    assert rep.verify.ok and rep.dtype == "float16"
    store = RedisFeatureStore(loaded.url, "fp16", 2, registry=None)
    assert store.dtype == np.float16 and store.stats()["blob_bytes"] == 8 + 2 * F
    ids = np.random.default_rng(1).integers(0, N, 300)
    out = store.get(ids)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x.astype(np.float16)[ids].astype(np.float32))
    np.testing.assert_allclose(out, x[ids], rtol=2**-10, atol=2**-14)


# --------------------------------------------------------------------------- bad blobs
def test_wrong_length_nan_and_foreign_blobs_are_corrupt_and_missing_keys_not_found(redis_server, x):
    load_features(x, redis_server.url, version=3, chunk_size=256, progress=False, fingerprint="fpBad")
    store = RedisFeatureStore(redis_server.url, "fpBad", 3, registry=None, **FAST)
    raw = redis_server.client()
    codec = BlobCodec("float32", F)
    good = raw.get(_key("fpBad", 3, 10))
    assert good == codec.encode_blobs(x[10:11])[0]

    raw.set(_key("fpBad", 3, 10), good[:-4])  # wrong length
    with pytest.raises(FeatureCorrupt, match="wrong length") as e:
        store.get([3, 10, 10])
    assert e.value.node_ids.tolist() == [10]
    np.testing.assert_array_equal(store.get([3, 11]), x[[3, 11]])  # the rest still serves

    nan = bytearray(good)
    nan[8 + 4 * 5 : 8 + 4 * 6] = np.float32(np.nan).tobytes()
    raw.set(_key("fpBad", 3, 10), bytes(nan))
    with pytest.raises(FeatureCorrupt, match="NaN"):
        store.get([10])
    raw.set(_key("fpBad", 3, 10), BlobCodec("float16", 2 * F).encode_blobs(np.zeros((1, 2 * F)))[0])
    with pytest.raises(FeatureCorrupt, match="wrong header"):  # same length, other dtype and width
        store.get([10])
    raw.delete(_key("fpBad", 3, 10))
    raw.hset(_key("fpBad", 3, 10), "a", "b")  # a key of the wrong Redis type (MGET answers nil for it)
    with pytest.raises(FeatureCorrupt, match="wrong Redis type"):
        store.get([10])

    raw.set(_key("fpBad", 3, 10), good)
    raw.delete(_key("fpBad", 3, 20))
    with pytest.raises(FeatureNotFound, match="still marked live") as nf:
        store.get([20, 21])
    assert nf.value.node_ids.tolist() == [20]
    assert store.stats()["errors"] == {"FeatureCorrupt": 4, "FeatureNotFound": 1}
    raw.close()


# --------------------------------------------------------------------------- versions and graphs
def test_fingerprints_and_versions_never_mix(redis_server):
    url = redis_server.url
    a1, a2, b1 = _features(21), _features(22), _features(23)
    load_features(a1, url, version=1, fingerprint="fpMixA", progress=False, chunk_size=300)
    load_features(a2, url, version=2, fingerprint="fpMixA", progress=False, chunk_size=300)
    load_features(b1, url, version=1, fingerprint="fpMixB", progress=False, chunk_size=300)
    ids = np.arange(0, N, 7)
    for fp, v, want in (("fpMixA", 1, a1), ("fpMixA", 2, a2), ("fpMixB", 1, b1)):
        np.testing.assert_array_equal(RedisFeatureStore(url, fp, v, registry=None).get(ids), want[ids])
    current = RedisFeatureStore(url, "fpMixA", registry=None)  # version=None: the current pointer
    assert current.version == 2
    load_features(a1, url, version=1, fingerprint="fpMixA", progress=False)  # re-running v1 keeps v2 current
    assert RedisFeatureStore(url, "fpMixA", registry=None).version == 2
    with pytest.raises(FeatureNotFound, match="no features"):
        RedisFeatureStore(url, "fpMixA", 9, registry=None)
    with pytest.raises(FeatureNotFound, match="no live feature version"):
        RedisFeatureStore(url, "fpNone", registry=None)
    with pytest.raises(FeatureNotFound, match="cover 700 nodes"):
        RedisFeatureStore(url, "fpMixA", 1, expect_num_nodes=N + 1, registry=None)
    with pytest.raises(FeatureNotFound, match="width 16"):
        RedisFeatureStore(url, "fpMixA", 1, expect_num_features=F + 1, registry=None)
    assert [m["version"] for m in list_versions(url, "fpMixA")] == ["1", "2"]
    assert delete_features(url, "fpMixA", 2) == N + 2  # node keys + meta + chunk digests
    assert RedisFeatureStore(url, "fpMixA", registry=None).version == 1  # current moved back


@pytest.mark.timeout(300)  # the small_dataset fixture imports kernels (torch): slow on a busy machine
def test_open_store_with_a_dataset_picks_the_version_of_that_dataset(redis_server, small_dataset):
    url = redis_server.url
    ds = small_dataset
    rep = load_features(ds, url, version=4, progress=False, chunk_size=200)  # fingerprint from the graph
    assert rep.fingerprint == ds.graph.fingerprint()
    other = ds.x[::-1].copy()
    load_features(other, url, version=5, fingerprint=ds.graph.fingerprint(), progress=False)
    store = open_store(url, dataset=ds, expect_dataset_fingerprint=ds.fingerprint(), registry=None)
    assert isinstance(store, RedisFeatureStore) and store.version == 4
    np.testing.assert_array_equal(store.get([0, 5, 5]), ds.x[[0, 5, 5]])
    assert open_store(url, dataset=ds, registry=None).version == 5  # plain: the current (newest) version


# --------------------------------------------------------------------------- loader
def test_loader_resumes_after_an_interruption_and_verifies(redis_server, x):
    url = redis_server.url

    def stop_after_two(done, total):
        assert total == 6
        if done == 2:
            raise KeyboardInterrupt("simulated interruption")

    with pytest.raises(KeyboardInterrupt):
        load_features(x, url, version=1, chunk_size=128, progress=False, fingerprint="fpResume",
                      progress_callback=stop_after_two)
    meta = redis_server.client().hgetall("gnnserve:feat:fpResume:v1:meta")
    assert meta[b"state"] == b"loading" and meta[b"chunks_done"] == b"2" and meta[b"count"] == b"256"
    with pytest.raises(FeatureNotFound, match="not live"):
        RedisFeatureStore(url, "fpResume", 1, registry=None)
    part = load_features(x, url, version=1, chunk_size=999, progress=False, fingerprint="fpResume", max_chunks=1)
    assert (part.complete, part.state, part.chunk_size, part.chunks_written, part.chunks_skipped) == \
        (False, "loading", 128, 1, 2)  # the chunk size of the interrupted load is kept
    rep = load_features(x, url, version=1, chunk_size=128, progress=True, fingerprint="fpResume")
    assert rep.resumed and rep.complete and rep.state == "live"
    assert (rep.chunks_written, rep.chunks_skipped) == (3, 3)
    assert rep.verify.ok and rep.verify.count == N and rep.verify.compared_with == "the dataset"
    np.testing.assert_array_equal(RedisFeatureStore(url, "fpResume", 1, registry=None).get(np.arange(N)), x)
    again = load_features(x, url, version=1, chunk_size=128, progress=False, fingerprint="fpResume")
    assert again.already_live and again.chunks_written == 0 and again.verify.ok  # idempotent


def test_loader_refuses_other_features_for_an_existing_version(redis_server, x):
    url = redis_server.url
    load_features(x, url, version=1, progress=False, fingerprint="fpOther", chunk_size=200)
    with pytest.raises(FeatureLoadError, match="live versions are never rewritten"):
        load_features(_features(99), url, version=1, progress=False, fingerprint="fpOther")
    load_features(x, url, version=2, progress=False, fingerprint="fpOther", chunk_size=200, max_chunks=1)
    with pytest.raises(FeatureLoadError, match="overwrite=True"):
        load_features(_features(99), url, version=2, progress=False, fingerprint="fpOther")
    rep = load_features(_features(99), url, version=2, progress=False, fingerprint="fpOther", overwrite=True)
    assert rep.state == "live" and not rep.resumed
    np.testing.assert_array_equal(RedisFeatureStore(url, "fpOther", 2, registry=None).get([3]), _features(99)[[3]])


def test_a_held_lock_blocks_a_second_loader(redis_server, x):
    raw = redis_server.client()
    raw.set("gnnserve:feat:fpLock:v1:lock", "someone-else", px=5000)
    with pytest.raises(FeatureLoadError, match="another load"):
        load_features(x, redis_server.url, version=1, progress=False, fingerprint="fpLock")
    assert raw.get("gnnserve:feat:fpLock:v1:lock") == b"someone-else"  # not released by the loser
    raw.close()


def test_verify_detects_a_tampered_key_and_reloading_repairs_it(redis_server, x):
    url = redis_server.url
    load_features(x, url, version=1, chunk_size=100, progress=False, fingerprint="fpTamper")
    assert verify_features(url, "fpTamper").ok
    raw = redis_server.client()
    forged = BlobCodec("float32", F).encode_blobs(x[[250]] + 0.5)[0]  # a valid blob with other numbers
    raw.set(_key("fpTamper", 1, 250), forged)
    rep = verify_features(url, "fpTamper", 1)
    assert not rep.ok and rep.bad_chunks == [2] and rep.count == N and rep.corrupt == 0
    assert rep.checksum != rep.expected_checksum
    with_data = verify_features(url, "fpTamper", 1, dataset=x)
    assert not with_data.ok and with_data.sample_bad_nodes == [250]
    raw.delete(_key("fpTamper", 1, 640))
    rep = verify_features(url, "fpTamper", 1)
    assert rep.missing == 1 and rep.bad_chunks == [2, 6] and "FAILED" in rep.summary()
    fixed = load_features(x, url, version=1, chunk_size=100, progress=False, fingerprint="fpTamper")
    assert fixed.already_live and fixed.chunks_written == 2 and fixed.verify.ok
    assert verify_features(url, "fpTamper", 1).ok
    # without the per-chunk digests the stored checksum still catches a forged row
    raw.delete("gnnserve:feat:fpTamper:v1:chunks")
    assert verify_features(url, "fpTamper", 1).ok
    raw.set(_key("fpTamper", 1, 3), forged)
    rep = verify_features(url, "fpTamper", 1)
    assert not rep.ok and rep.bad_chunks == [] and rep.checksum != rep.expected_checksum
    raw.close()


# --------------------------------------------------------------------------- faults
def test_redis_stopped_gives_unavailable_then_recovers_without_a_new_store(redis_factory, x):
    srv = redis_factory()
    load_features(x, srv.url, version=1, progress=False, fingerprint="fpDown", chunk_size=350)
    store = RedisFeatureStore(srv.url, "fpDown", 1, registry=None, **FAST)
    ids = np.arange(0, N, 3)
    np.testing.assert_array_equal(store.get(ids), x[ids])

    srv.stop(save=True)  # graceful stop that keeps the data for the restart
    with pytest.raises(FeatureUnavailable, match="unavailable") as e:
        store.get(ids)
    assert srv.url.split("@")[-1] in str(e.value)  # names the server (masked URL)
    assert not store.ping()
    srv.start()
    np.testing.assert_array_equal(store.get(ids), x[ids])  # same store object, pool reconnects

    srv.pause()  # a hung server: the socket timeout bounds the wait
    try:
        with pytest.raises(FeatureUnavailable, match="Timeout"):
            store.get(ids)
    finally:
        srv.resume()
    np.testing.assert_array_equal(store.get(ids), x[ids])

    srv.kill()  # dies without saving: after a restart the data is gone
    srv.start()
    with pytest.raises(FeatureNotFound, match=r"metadata .* is gone too"):
        store.get(ids)
    assert store.stats()["errors"] == {"FeatureUnavailable": 2, "FeatureNotFound": 1}


def test_tiered_over_redis_identical_numbers_and_hot_rows_when_down(redis_factory, x):
    srv = redis_factory()
    load_features(x, srv.url, version=1, progress=False, fingerprint="fpTier")
    backend = RedisFeatureStore(srv.unix_url, "fpTier", 1, registry=None, **FAST)
    ptr = np.arange(0, 6 * 40 + 1, 40)  # 6 fake top-K lists of 40 nodes around 0..99
    nodes = np.random.default_rng(2).integers(0, 100, ptr[-1])
    store = open_store(backend, hot=(ptr, nodes), cache_bytes=150 * F * 4, hot_fraction=0.5, registry=None)
    assert isinstance(store, TieredFeatureStore) and store.stats()["hot_filled"] == 75
    rng = np.random.default_rng(3)
    for _ in range(20):
        ids = np.concatenate([rng.integers(0, 100, 30), rng.integers(0, N, 10)])
        np.testing.assert_array_equal(store.get(ids), x[ids])
    s = store.stats()
    assert 0.5 < s["hit_ratio"] < 1 and s["hits_hot"] > 0 and s["hits_lru"] > 0
    assert s["backend_latency"]["count"] >= 1 and s["backend_latency"]["p50_ms"] > 0

    hot = store.hot_ids
    srv.stop(save=True)
    np.testing.assert_array_equal(store.get(hot[:20]), x[hot[:20]])  # served by the hot tier
    cold = np.setdiff1d(np.arange(N), np.concatenate([hot, np.arange(100)]))[:5]
    with pytest.raises(FeatureUnavailable, match="not cached"):
        store.get(np.concatenate([hot[:3], cold]))
    rows, present = store.get_partial(np.concatenate([hot[:3], cold]))
    assert present.tolist() == [True] * 3 + [False] * 5 and np.isnan(rows[3:]).all()
    np.testing.assert_array_equal(rows[:3], x[hot[:3]])
    srv.start()
    np.testing.assert_array_equal(store.get(cold), x[cold])

    # a corrupt row from the backend fails the batch and is never cached
    raw = srv.client()
    victim = int(np.setdiff1d(np.arange(N), np.concatenate([hot, np.arange(100), cold]))[0])
    good = raw.get(_key("fpTier", 1, victim))
    raw.set(_key("fpTier", 1, victim), good[:-2])
    with pytest.raises(FeatureCorrupt):
        store.get([victim, int(hot[0])])
    raw.set(_key("fpTier", 1, victim), good)
    np.testing.assert_array_equal(store.get([victim]), x[[victim]])
    raw.close()


# --------------------------------------------------------------------------- secrets and URLs
def test_password_url_works_and_never_shows(redis_factory, x, caplog):
    secret = "Sup3r-s3cret!pw"
    srv = redis_factory(password=secret)
    caplog.set_level(logging.DEBUG)
    rep = load_features(x, srv.url, version=1, progress=False, fingerprint="fpPw")
    store = RedisFeatureStore(srv.unix_url, "fpPw", 1, registry=None, **FAST)
    np.testing.assert_array_equal(store.get([1, 2]), x[[1, 2]])
    texts = [repr(store), str(store.stats()), rep.summary(), str(rep), verify_features(srv.url, "fpPw").summary()]
    wrong = srv.url.replace("Sup3r", "Wrong")
    raw = srv.client()
    for url in (wrong, srv.url.replace(f":{secret}@", "").replace("%21", "")):  # wrong and no password
        before = raw.info("stats")["total_connections_received"]
        with pytest.raises(FeatureUnavailable) as e:
            RedisFeatureStore(url, "fpPw", 1, registry=None, **FAST)
        texts.append(str(e.value))
        assert "credentials" in str(e.value)
        # refused credentials are not a transient error: one connection attempt, no retries
        assert raw.info("stats")["total_connections_received"] - before == 1
    raw.close()
    srv.stop(save=True)
    with pytest.raises(FeatureUnavailable) as e:
        store.get([1])
    texts.append(str(e.value))
    srv.start()
    texts += [r.getMessage() for r in caplog.records]
    joined = "\n".join(texts)
    assert "***" in joined
    for leak in (secret, "Sup3r", "s3cret", "Wrong-s3cret"):
        assert leak not in joined


def test_redis_cluster_store_and_a_master_restart(redis_cluster, x):
    url = redis_cluster.url
    rep = load_features(x, url, version=1, progress=False, fingerprint="fpCluster", chunk_size=350)
    assert rep.verify.ok
    sizes = []
    for node in redis_cluster.nodes:
        c = node.client()
        sizes.append(c.dbsize())
        c.close()
    assert all(s > N // 6 for s in sizes) and sum(sizes) >= N  # keys spread over the 3 masters
    store = RedisFeatureStore(url, "fpCluster", registry=None, socket_timeout=1.0, connect_timeout=0.5, retries=2,
                              backoff_cap=0.2)
    ids = np.random.default_rng(4).integers(0, N, 500)
    np.testing.assert_array_equal(store.get(ids), x[ids])
    assert store.ping()
    redis_cluster.stop_node(1, save=True)  # a master restarts (keeping its data)
    try:
        with pytest.raises(FeatureUnavailable):
            store.get(ids)
        assert not store.ping()
    finally:
        redis_cluster.start_node(1)
        redis_cluster.wait_ok()
    # the same store recovers once the client has refreshed its slot map (a request or two)
    for attempt in range(5):
        try:
            out = store.get(ids)
            break
        except FeatureUnavailable:
            if attempt == 4:
                raise
    np.testing.assert_array_equal(out, x[ids])
