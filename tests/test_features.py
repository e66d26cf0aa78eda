"""Feature stores without a Redis server: id helpers, memory store, blob codec, URLs, tiered cache.

The tiered store is exercised in front of a real memory store; "backend down" is a closed store
(a real state of the store, which then raises FeatureUnavailable), not a mock. Redis itself is
tested in ``test_features_redis.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from serve.features import (
    FeatureCorrupt,
    FeatureNotFound,
    FeatureUnavailable,
    InvalidNodeIds,
    MemoryFeatureStore,
    TieredFeatureStore,
    check_node_ids,
    dedupe_ids,
    hot_set_from_index,
    mask_url,
    open_store,
    parse_redis_url,
)
from serve.features.redis_store import BlobCodec, FeatureKeys, connect

N, F = 500, 12


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((N, F)).astype(np.float32)


# --------------------------------------------------------------------------- id helpers
def test_check_node_ids_accepts_integer_arrays_and_refuses_the_rest():
    assert check_node_ids([3, 1, 3], 5).dtype == np.int64
    assert check_node_ids(np.array([4], dtype=np.uint16), 5).tolist() == [4]
    assert check_node_ids([], 5).shape == (0,)
    for bad in ([-1], [5], [0, 7]):
        with pytest.raises(InvalidNodeIds, match=r"\[0, 5\)"):
            check_node_ids(bad, 5)
    with pytest.raises(InvalidNodeIds, match="integers"):
        check_node_ids([1.0, 2.0], 5)
    with pytest.raises(InvalidNodeIds, match="1-D"):
        check_node_ids([[1, 2]], 5)
    with pytest.raises(InvalidNodeIds, match="1-D"):
        check_node_ids(np.int64(3), 5)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60))
def test_dedupe_ids_reconstructs_the_batch(ids):
    arr = np.array(ids, dtype=np.int64)
    unique, inverse = dedupe_ids(arr)
    assert np.all(np.diff(unique) > 0)
    rebuilt = unique if inverse is None else unique[inverse]
    assert rebuilt.tolist() == ids
    if len(set(ids)) == len(ids) and ids == sorted(ids):
        assert inverse is None  # already unique and sorted: no gather needed


# --------------------------------------------------------------------------- memory store
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, N - 1), max_size=80))
def test_memory_store_returns_rows_in_order_with_duplicates(x, ids):
    store = MemoryFeatureStore(x, registry=None)
    out = store.get(np.array(ids, dtype=np.int64))
    assert out.dtype == np.float32 and out.shape == (len(ids), F) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, x[ids])


def test_memory_store_float16_widens_and_errors(x):
    store = MemoryFeatureStore(x.astype(np.float16), registry=None)
    assert store.dtype == np.float16 and store.row_bytes == F * 2
    out = store.get([4, 4, 0])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x.astype(np.float16)[[4, 4, 0]].astype(np.float32))
    with pytest.raises(InvalidNodeIds):
        store.get([N])
    assert store.stats()["errors"] == {}  # validation errors are the caller's, not the store's
    store.close()
    with pytest.raises(FeatureUnavailable, match="closed"):
        store.get([0])
    with pytest.raises(ValueError, match="float32 or float16"):
        MemoryFeatureStore(x.astype(np.float64))
    with pytest.raises(ValueError, match="NaN"):
        bad = x.copy()
        bad[2, 3] = np.nan
        MemoryFeatureStore(bad, check_finite=True)


def test_memory_store_opens_npy_mmap_npz_and_dataset_dir(tmp_path, small_dataset):
    from kernels.datasets import save_npz

    np.save(tmp_path / "x.npy", small_dataset.x)
    mm = MemoryFeatureStore.open(tmp_path / "x.npy", registry=None)
    assert isinstance(mm.array, np.memmap)
    ids = np.array([5, 1, 5, 599])
    np.testing.assert_array_equal(mm.get(ids), small_dataset.x[ids])
    save_npz(small_dataset, tmp_path / "d.npz")
    np.testing.assert_array_equal(open_store(str(tmp_path / "d.npz"), registry=None).get(ids), small_dataset.x[ids])
    small_dataset.save(tmp_path / "dir")
    np.testing.assert_array_equal(open_store(tmp_path / "dir", registry=None).get(ids), small_dataset.x[ids])
    with pytest.raises(ValueError, match="cannot open"):
        MemoryFeatureStore.open(tmp_path / "x.txt")


# --------------------------------------------------------------------------- blob codec
def test_codec_float32_round_trip_is_exact_and_float16_within_tolerance(x):
    ids = np.arange(N)
    c32 = BlobCodec("float32", F)
    blobs = c32.encode_blobs(x)
    assert len(blobs) == N and {len(b) for b in blobs} == {8 + 4 * F}
    np.testing.assert_array_equal(c32.decode(blobs, ids), x)
    c16 = BlobCodec(np.float16, F)
    back = c16.decode(c16.encode_blobs(x), ids)
    np.testing.assert_array_equal(back, x.astype(np.float16).astype(np.float32))
    np.testing.assert_allclose(back, x, rtol=2**-10, atol=2**-14)
    with pytest.raises(ValueError, match="overflow float16"):
        c16.encode(np.full((1, F), 1e6, dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        c32.encode(np.full((1, F), np.nan, dtype=np.float32))


def test_codec_refuses_wrong_length_header_nan_and_reports_missing(x):
    ids = np.arange(10, 20)
    c = BlobCodec("float32", F)
    blobs = c.encode_blobs(x[10:20])
    short = list(blobs)
    short[3] = short[3][:-4]
    with pytest.raises(FeatureCorrupt, match="wrong length") as e:
        c.decode(short, ids)
    assert e.value.node_ids.tolist() == [13]
    # A float16 blob of width 2F has exactly the length of a float32 blob of width F: the header tells.
    other = BlobCodec("float16", 2 * F).encode_blobs(np.zeros((1, 2 * F), np.float32))[0]
    assert len(other) == len(blobs[0])
    mixed = list(blobs)
    mixed[7] = other
    with pytest.raises(FeatureCorrupt, match=r"wrong header.*float16 x 24") as e:
        c.decode(mixed, ids)
    assert e.value.node_ids.tolist() == [17]
    nan = bytearray(blobs[1])
    nan[8:12] = np.float32(np.nan).tobytes()
    with_nan = list(blobs)
    with_nan[1] = bytes(nan)
    with pytest.raises(FeatureCorrupt, match="NaN") as e:
        c.decode(with_nan, ids)
    assert e.value.node_ids.tolist() == [11]
    missing = list(blobs)
    missing[0] = missing[9] = None
    with pytest.raises(FeatureNotFound) as nf:
        c.decode(missing, ids)
    assert nf.value.node_ids.tolist() == [10, 19] and nf.value.num_missing == 2
    m, k = c.classify([*with_nan[:5], None, *short[6:]])
    assert np.flatnonzero(m).tolist() == [5] and np.flatnonzero(k).tolist() == [1]


def test_key_schema_includes_fingerprint_version_and_hash_tag():
    k = FeatureKeys("abc123", 7, shards=16)
    assert k.node_key(35) == b"gnnserve:feat:abc123:v7:{3}:35"
    assert k.node_keys(np.array([35, 0])) == [b"gnnserve:feat:abc123:v7:{3}:35", b"gnnserve:feat:abc123:v7:{0}:0"]
    assert k.meta == "gnnserve:feat:abc123:v7:meta" and k.current == "gnnserve:feat:abc123:current"
    assert FeatureKeys("abc123", 8).node_key(35) != FeatureKeys("abc124", 7).node_key(35)
    for bad in ("", "a:b", "{x}", "a b"):
        with pytest.raises(ValueError):
            FeatureKeys(bad, 1)
    with pytest.raises(ValueError):
        FeatureKeys("abc", 0)


# --------------------------------------------------------------------------- URLs
def test_url_forms_parse_and_mask_the_password():
    t = parse_redis_url("redis://:s3cr%40t@10.0.0.1:6380/2?socket_timeout=0.25")
    assert (t.nodes, t.password, t.options["db"], t.cluster, t.tls) == ((("10.0.0.1", 6380),), "s3cr@t", "2", False,
                                                                        False)
    assert "s3cr" not in t.masked and "***" in t.masked and "s3cr" not in repr(t)
    assert t.scrub("oops redis://:s3cr%40t@10.0.0.1:6380/2 and s3cr@t") .count("s3cr") == 0
    u = parse_redis_url("unix://:pw@/run/redis.sock?db=1")
    assert (u.scheme, u.path, u.password) == ("unix", "/run/redis.sock", "pw")
    c = parse_redis_url("redis+cluster://user:pw@h1:7000,h2:7001,[::1]:7002")
    assert c.cluster and c.nodes == (("h1", 7000), ("h2", 7001), ("::1", 7002)) and c.username == "user"
    assert parse_redis_url("redis://h1:7000?cluster=1").cluster
    assert parse_redis_url("rediss+cluster://h:1").tls
    q = parse_redis_url("redis://h:1?password=zz")
    assert q.password == "zz" and "zz" not in q.masked
    assert mask_url("redis://user:hunter2@h:1/0") == "redis://user:***@h:1/0"
    for bad in ("http://h:1", "h:1", "redis://a:1,b:2", "unix://", "redis://h:1/x"):
        with pytest.raises(ValueError) as e:
            parse_redis_url(bad)
        assert "hunter2" not in str(e.value)


def test_connect_builds_tls_unix_and_pool_settings_without_a_server():
    tls = connect("rediss://:pw@example.invalid:6380/0?ssl_cert_reqs=none", socket_timeout=0.3)
    pool = tls.connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert pool.connection_kwargs["password"] == "pw" and pool.connection_kwargs["socket_timeout"] == 0.3
    assert pool.max_connections == 64
    unix = connect("unix:///tmp/none.sock?socket_timeout=0.7")
    assert unix.connection_pool.connection_class is redis.UnixDomainSocketConnection
    assert unix.connection_pool.connection_kwargs["socket_timeout"] == 0.7  # the URL wins
    retry = unix.connection_pool.connection_kwargs["retry"]
    assert retry.get_retries() == 2
    tls.close()
    unix.close()


# --------------------------------------------------------------------------- hot set
def test_hot_set_ranks_by_frequency_ties_by_id():
    ptr = np.array([0, 3, 5, 8, 8])
    nodes = np.array([4, 1, 2, 2, 4, 2, 7, 0, 99])  # the last entry lies beyond ptr[-1]: ignored
    assert hot_set_from_index(ptr, nodes, 10).tolist() == [2, 4, 0, 1, 7]
    assert hot_set_from_index(ptr, nodes, 10, min_count=2).tolist() == [2, 4]
    assert hot_set_from_index(np.array([0]), np.zeros(0, np.int64)).tolist() == []
    with pytest.raises(ValueError):
        hot_set_from_index(np.array([1, 2]), nodes)
    with pytest.raises(ValueError):
        hot_set_from_index(ptr, nodes, 5)


# --------------------------------------------------------------------------- tiered
def _tiered(x, budget_rows, hot_ids=None, registry=None, **kw):
    base = MemoryFeatureStore(x, registry=None, name="mem")
    return TieredFeatureStore(base, hot_ids=hot_ids, budget_bytes=budget_rows * F * 4, registry=registry, **kw)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, N - 1), max_size=40), min_size=1, max_size=12),
       st.integers(0, 60), st.sampled_from([0.0, 0.5, 1.0]))
def test_tiered_returns_identical_numbers_under_any_eviction(x, batches, budget_rows, hot_fraction):
    hot = np.arange(N)[::-1].copy()  # any priority order
    store = _tiered(x, budget_rows, hot_ids=hot, hot_fraction=hot_fraction)
    uniq_total = 0
    for b in batches:
        ids = np.array(b, dtype=np.int64)
        np.testing.assert_array_equal(store.get(ids), x[ids])
        uniq_total += len(set(b))
    s = store.stats()
    assert s["hits_hot"] + s["hits_lru"] + s["misses"] == uniq_total
    assert s["lru_used"] <= s["lru_rows"] and s["hot_rows"] + s["lru_rows"] == budget_rows
    assert s["hot_filled"] == s["hot_rows"]  # warmed at construction


def test_tiered_hit_ratio_lru_eviction_and_metrics(x):
    reg = CollectorRegistry()
    hot = hot_set_from_index(np.array([0, 3, 6]), np.array([1, 2, 3, 1, 2, 9]), N)  # ranks 1, 2 first
    store = _tiered(x, 10, hot_ids=hot, registry=reg, hot_fraction=0.2, name="t1")  # 2 hot rows + 8 LRU rows
    assert sorted(store.hot_ids.tolist()) == [1, 2]

    def delta(ids):
        before = store.stats()
        np.testing.assert_array_equal(store.get(ids), x[ids])
        after = store.stats()
        return tuple(after[k] - before[k] for k in ("hits_hot", "hits_lru", "misses"))

    assert delta([1, 2, 50, 51]) == (2, 0, 2)
    assert delta([50, 51, 1]) == (1, 2, 0)
    assert delta(np.arange(100, 106)) == (0, 0, 6)    # the LRU tier is now full (8 rows)
    assert delta([50]) == (0, 1, 0)                   # 50 becomes the most recently used
    assert delta([200, 201, 202]) == (0, 0, 3)        # evicts the 3 least recently used: 51 first
    assert store.stats()["evictions"] == 3 and store.stats()["lru_used"] == 8
    assert delta([50, 200, 201, 202]) == (0, 4, 0)
    assert delta([51]) == (0, 0, 1)
    s = store.stats()
    assert (s["hits_hot"], s["hits_lru"], s["misses"]) == (3, 7, 12)
    assert s["hit_ratio"] == pytest.approx(10 / 22) and s["hot_hit_ratio"] == pytest.approx(3 / 22)
    sv = reg.get_sample_value
    assert sv("gnnserve_feature_cache_hits_total", {"store": "t1", "tier": "hot"}) == 3
    assert sv("gnnserve_feature_cache_hits_total", {"store": "t1", "tier": "lru"}) == 7
    assert sv("gnnserve_feature_cache_misses_total", {"store": "t1"}) == 12
    # the warm-up of the hot tier plus the 4 batches with misses
    assert sv("gnnserve_feature_backend_seconds_count", {"store": "t1"}) == 5
    assert sv("gnnserve_feature_fetch_seconds_count", {"store": "t1"}) == 7
    assert sv("gnnserve_feature_cache_bytes", {"store": "t1", "tier": "hot"}) == 2 * F * 4
    assert sv("gnnserve_feature_cache_bytes", {"store": "t1", "tier": "lru"}) == 8 * F * 4
    # a batch with more misses than the LRU tier holds is still answered in full
    assert delta(np.arange(300, 330)) == (0, 0, 30)
    assert store.stats()["lru_used"] == 8
    # two stores on one registry share the metric families without clashing
    other = _tiered(x, 4, registry=reg, name="t2")
    other.get([0])
    assert sv("gnnserve_feature_cache_misses_total", {"store": "t2"}) == 1


def test_tiered_is_consistent_under_concurrent_eviction(x):
    import threading

    store = _tiered(x, 30, hot_ids=np.arange(10), hot_fraction=0.3)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(150):
                ids = rng.integers(0, 80, rng.integers(1, 25))
                np.testing.assert_array_equal(store.get(ids), x[ids])
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    s = store.stats()
    assert s["evictions"] > 0 and s["lru_used"] <= s["lru_rows"] == 21
    held = store._node[store._filled]  # every cached row is the row of the node mapped to its slot
    assert np.array_equal(store._slot[held], np.flatnonzero(store._filled))


def test_tiered_serves_hot_rows_when_the_backend_is_down(x):
    base = MemoryFeatureStore(x, registry=None)
    store = TieredFeatureStore(base, hot_ids=np.array([7, 8, 9]), budget_bytes=3 * F * 4, hot_fraction=1.0,
                               registry=None)
    base.close()  # the backend is now down: every call to it raises FeatureUnavailable
    np.testing.assert_array_equal(store.get([9, 7, 7]), x[[9, 7, 7]])
    with pytest.raises(FeatureUnavailable, match="1 of 2 rows are not cached"):
        store.get([7, 100])
    rows, present = store.get_partial([100, 8, 100])
    assert present.tolist() == [False, True, False]
    np.testing.assert_array_equal(rows[1], x[8])
    assert np.isnan(rows[[0, 2]]).all()  # never plausible numbers for what is missing
    assert store.stats()["backend_errors"]["FeatureUnavailable"] == 2


def test_tiered_warms_lazily_when_the_backend_was_down_at_start(x):
    base = MemoryFeatureStore(x, registry=None)
    base.close()
    store = TieredFeatureStore(base, hot_ids=np.array([3, 4]), budget_bytes=8 * F * 4, registry=None)
    assert store.stats()["hot_filled"] == 0
    with pytest.raises(FeatureUnavailable):
        store.get([3])
    store.backend = MemoryFeatureStore(x, registry=None)  # the backend is back
    np.testing.assert_array_equal(store.get([4, 3]), x[[4, 3]])
    assert store.stats()["hot_filled"] == 2


def test_tiered_torch_tensor_path_matches(x):
    torch = pytest.importorskip("torch")
    store = _tiered(x, 50, hot_ids=np.arange(20), device="cpu")  # torch tensors on the host
    assert store.stats()["device"] == "cpu"
    rng = np.random.default_rng(0)
    for _ in range(5):
        ids = rng.integers(0, N, 40)
        t = store.get_tensor(ids)
        assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
        np.testing.assert_array_equal(t.numpy(), x[ids])
        np.testing.assert_array_equal(store.get(ids), x[ids])
    half = TieredFeatureStore(MemoryFeatureStore(x.astype(np.float16), registry=None), hot_ids=np.arange(5),
                              budget_bytes=30 * F * 2, device="cpu", registry=None)
    np.testing.assert_array_equal(half.get([0, 1, 200]), x.astype(np.float16)[[0, 1, 200]].astype(np.float32))


def test_open_store_memory_default_and_tiered_flag(small_dataset):
    ds = small_dataset
    m = open_store(dataset=ds, registry=None)
    assert isinstance(m, MemoryFeatureStore)
    ptr = np.array([0, 3, 6])
    t = open_store("memory", dataset=ds, hot=(ptr, np.array([5, 6, 7, 5, 6, 8])), cache_bytes=1 << 20,
                   registry=None, name="m")
    assert isinstance(t, TieredFeatureStore) and t.hot_ids[:2].tolist() == [5, 6]
    assert t.backend.name == "m-backend"
    np.testing.assert_array_equal(t.get([5, 0, 5]), ds.x[[5, 0, 5]])
    t.close()
    assert not t.backend.ping()  # the tiered store owns the backend open_store made
    with pytest.raises(ValueError, match="dataset"):
        open_store()
    with pytest.raises(ValueError, match="unknown feature store URL"):
        open_store("http://user:pw@h/")
