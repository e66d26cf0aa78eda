"""A chunked ``predict`` answers every row at the one graph version it reports, while updates land between chunks.

A production tester's call of 27,504 ids (7 requests) over a graph taking an update every ~10 ms came back with
about 2,000 rows computed at another graph version than the result's ``graph_version``, and duplicate ids answered
differently: a server answers each request from its newest graph, and the SDK reported the newest version any
chunk saw. Now the SDK sends the chunks behind the newest version again (asking for it) until all agree, raises
``AbortedError`` when updates outrun ``max_version_rounds`` rounds, and with ``allow_mixed_versions=True`` returns
each row's own version (``PredictResult.graph_versions``).

Real servers on loopback (a per-request limit of 8 nodes, so a short list is several requests) over a repository of
their own; updates toggle a node's features between two states (even versions: as loaded, odd: changed), so the
answer at any version is one of two references computed beforehand. For a deterministic interleaving the tests
update the graph from a client subclass's ``_invoke`` (the one place every RPC of a call goes through) right
after chosen Predict requests; one test runs a writer thread instead and checks the invariant on every call.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from clients import AbortedError, AsyncGnnClient, GnnClient, NewNode
from clients._core import ChunkLimits, PredictPlan
from clients._gen import gnnserve_pb2 as pb

from .serving import ServerThread

LIMIT = 8  # the server's max_nodes_per_request here
MODEL = "gcn"


@pytest.fixture
def server(tiny_repo, tmp_path):
    """A server of its own (its own update log under REPO/_live) over the tiny repository's GCN."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("gcn", "_data"):
        (repo / name).symlink_to(tiny_repo / name)
    with ServerThread(repo, {"poll_s": 0, "runtime_kw": {"max_nodes_per_request": LIMIT}}) as srv:
        yield srv


class Toggle:
    """The graph's two states: node ``t``'s features as loaded (even versions) or changed (odd versions)."""

    def __init__(self, ds: Any, address: str):
        g = ds.graph
        self.t = int(np.argmax(g.degrees))
        self.hot = [self.t, *(int(v) for v in g.neighbors(self.t)[:6])]
        self.rows = (np.asarray(ds.x[self.t], np.float32), np.asarray(ds.x[self.t], np.float32) * 3 + 1)
        self.address = address
        self.writer = GnnClient(address, timeout=60)
        self.updates = 0

    def flip(self) -> int:
        """One update: the graph to the other state; its new version."""
        v = self.writer.get_model(MODEL).graph_version
        up = self.writer.update_graph(MODEL, features={self.t: self.rows[(v + 1) % 2]}, expect_graph_version=v)
        self.updates += 1
        return up.graph_version

    def close(self) -> None:
        self.writer.close()


def _nodes(tg: Toggle) -> np.ndarray:
    """The hot nodes first and last (duplicates in the first and the last request), others between."""
    others = [v for v in range(40, 80) if v not in tg.hot][:20]
    return np.array([*tg.hot, *others, *tg.hot], dtype=np.int64)


def _new_nodes(tg: Toggle, ds: Any) -> list[NewNode]:
    x = np.asarray(ds.x, np.float32)
    return [NewNode(x[(7 * i) % 800] + 0.5, [tg.t, tg.hot[1 + i % (len(tg.hot) - 1)]]) for i in range(11)]


def _references(tg: Toggle, nodes: np.ndarray, new: list[NewNode]) -> dict[int, np.ndarray]:
    """Probabilities of ``nodes`` then ``new`` at each state (0: as loaded, 1: changed), from calls no update
    interleaves (each one request per node or new node, so no chunking is involved); leaves the graph at an even
    version."""
    refs = {}
    with GnnClient(tg.address, timeout=60) as c:
        for state in (0, 1):
            v = c.get_model(MODEL).graph_version
            if v % 2 != state:
                v = tg.flip()
            rows = [c.predict(MODEL, [int(u)], sampling_width=0) for u in nodes]
            rows += [c.predict_new_node(MODEL, [nn], sampling_width=0) for nn in new]
            assert {r.graph_version for r in rows} == {v}
            refs[state] = np.concatenate([r.probabilities for r in rows])
        if c.get_model(MODEL).graph_version % 2:
            tg.flip()
    hot_rows = np.abs(refs[0] - refs[1]).max(axis=1) > 1e-4
    assert hot_rows[: len(tg.hot)].any() and (not new or hot_rows[-len(new):].all()), "the two states must answer differently"
    return refs


def _check_rows(res: Any, refs: dict[int, np.ndarray]) -> None:
    """Every row equals the reference at the version the result gives it."""
    assert res.graph_versions.shape == (len(res),)
    for v in np.unique(res.graph_versions):
        at = res.graph_versions == v
        np.testing.assert_allclose(res.probabilities[at], refs[int(v) % 2][at], atol=1e-5,
                                   err_msg=f"rows reported at graph version {v}")


class UpdatingClient(GnnClient):
    """A client that updates the graph (``toggle.flip()``) right after its Predict requests numbered in ``after``."""

    toggle: Toggle
    after: set[int]
    predicts = 0

    def _invoke(self, state: Any, fn: Any, request: Any) -> Any:
        resp = super()._invoke(state, fn, request)
        if isinstance(request, pb.PredictRequest):
            self.predicts += 1
            if self.predicts in self.after:
                self.toggle.flip()
        return resp


class AsyncUpdatingClient(AsyncGnnClient):
    toggle: Toggle
    after: set[int]
    predicts = 0

    async def _invoke(self, state: Any, fn: Any, request: Any) -> Any:
        resp = await super()._invoke(state, fn, request)
        if isinstance(request, pb.PredictRequest):
            self.predicts += 1
            if self.predicts in self.after:
                await asyncio.to_thread(self.toggle.flip)
        return resp


def _updating(cls: type, tg: Toggle, after: set[int], **kw: Any) -> Any:
    c = cls(tg.address, timeout=120, **kw)
    c.toggle, c.after, c.predicts = tg, set(after), 0
    return c


@pytest.fixture
def toggle(server, tiny_dataset):
    tg = Toggle(tiny_dataset, server.address)
    yield tg
    tg.close()


def test_an_update_between_chunks_is_resolved_to_one_version(toggle, tiny_dataset):
    """An update after the 2nd of 5 requests: the first two are sent again at the newest version; every row,
    both copies of each duplicate id and the new nodes, is the answer at the reported version."""
    nodes, new = _nodes(toggle), _new_nodes(toggle, tiny_dataset)
    refs = _references(toggle, nodes, new)
    with GnnClient(toggle.address, timeout=60) as c:  # no update during the call: no extra request
        quiet = c.predict(MODEL, nodes, sampling_width=0, new_nodes=new)
    n_req = -(-len(nodes) // LIMIT) + -(-len(new) // LIMIT)
    assert quiet.timing.chunks == n_req and quiet.timing.version_rounds == 0 and not quiet.mixed_versions
    _check_rows(quiet, refs)
    v0 = quiet.graph_version
    with _updating(UpdatingClient, toggle, after={2}) as c:
        res = c.predict(MODEL, nodes, sampling_width=0, new_nodes=new)
    assert res.graph_version == v0 + 1 and not res.mixed_versions, (c.predicts, toggle.updates, toggle.writer.get_model(MODEL).graph_version, res.graph_versions)
    assert (res.graph_versions == res.graph_version).all()
    assert res.timing.version_rounds == 1 and res.timing.chunks == n_req + 2
    _check_rows(res, refs)
    k = len(toggle.hot)
    np.testing.assert_array_equal(res.labels[:k], res.labels[len(nodes) - k : len(nodes)])  # duplicates agree
    np.testing.assert_allclose(res.probabilities[:k], res.probabilities[len(nodes) - k : len(nodes)], atol=1e-6)


def test_an_update_during_the_new_nodes_is_resolved_too(toggle, tiny_dataset):
    """predict_new_node chunked (11 new nodes, 8 per request): an update after its first request."""
    new = _new_nodes(toggle, tiny_dataset)
    refs = _references(toggle, np.zeros(0, np.int64), new)
    with _updating(UpdatingClient, toggle, after={1}) as c:
        res = c.predict_new_node(MODEL, new, sampling_width=0)
    assert res.timing.version_rounds == 1 and not res.mixed_versions and res.graph_version % 2 == 1
    _check_rows(res, refs)


def test_updates_outrunning_the_rounds_raise_or_are_told_per_row(toggle, tiny_dataset):
    """An update after every request: the chunks never agree. By default the call raises AbortedError after
    max_version_rounds rounds; with allow_mixed_versions nothing is sent again and each row's version is given."""
    nodes = _nodes(toggle)
    refs = _references(toggle, nodes, [])
    with _updating(UpdatingClient, toggle, after=set(range(1, 100)), max_version_rounds=2) as c:
        with pytest.raises(AbortedError, match="allow_mixed_versions"):
            c.predict(MODEL, nodes, sampling_width=0)
        n_req = -(-len(nodes) // LIMIT)
        assert c.predicts > n_req  # it did try again
        c.predicts = 0
        res = c.predict(MODEL, nodes, sampling_width=0, allow_mixed_versions=True)
    assert res.timing.chunks == n_req and res.timing.version_rounds == 0 and c.predicts == n_req
    assert res.mixed_versions and res.graph_version == int(res.graph_versions.max())
    assert len(np.unique(res.graph_versions)) == n_req  # one version per request
    _check_rows(res, refs)
    doc = res.to_dict()
    assert doc["mixed_versions"] and doc["graph_versions"] == res.graph_versions.tolist()


def test_zero_rounds_refuse_a_mixed_answer_at_once(toggle, tiny_dataset):
    nodes = _nodes(toggle)
    with _updating(UpdatingClient, toggle, after={1}, max_version_rounds=0) as c:
        with pytest.raises(AbortedError, match="older graph version"):
            c.predict(MODEL, nodes, sampling_width=0)
        assert c.predicts == -(-len(nodes) // LIMIT)


def test_the_async_client_resolves_one_version_too(toggle, tiny_dataset):
    nodes, new = _nodes(toggle), _new_nodes(toggle, tiny_dataset)
    refs = _references(toggle, nodes, new)

    async def main() -> tuple[Any, Any, Any]:
        async with _updating(AsyncUpdatingClient, toggle, after={3}) as c:
            one = await c.predict(MODEL, nodes, sampling_width=0, new_nodes=new)
            c.after, c.predicts = set(range(1, 100)), 0
            mixed = await c.predict(MODEL, nodes, sampling_width=0, new_nodes=new, allow_mixed_versions=True)
            with pytest.raises(AbortedError):
                await c.predict(MODEL, nodes, sampling_width=0, new_nodes=new)
            return one, mixed, c

    one, mixed, _ = asyncio.run(main())
    assert one.timing.version_rounds == 1 and not one.mixed_versions
    _check_rows(one, refs)
    assert mixed.mixed_versions
    _check_rows(mixed, refs)


def test_a_writer_thread_never_makes_a_mislabelled_answer(toggle, tiny_dataset):
    """The tester's scenario, small: a writer flips the graph continuously while a reader makes chunked calls;
    each call either raises AbortedError or answers every row at the version it reports."""
    nodes = _nodes(toggle)
    refs = _references(toggle, nodes, [])
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        with GnnClient(toggle.address, timeout=60) as w:
            while not stop.is_set():
                v = w.get_model(MODEL).graph_version
                try:
                    w.update_graph(MODEL, features={toggle.t: toggle.rows[(v + 1) % 2]}, expect_graph_version=v)
                except AbortedError:
                    pass
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)
                    return
                stop.wait(0.005)

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    answered = aborted = 0
    try:
        with GnnClient(toggle.address, timeout=120) as c:
            for _ in range(12):
                try:
                    res = c.predict(MODEL, nodes, sampling_width=0)
                except AbortedError:
                    aborted += 1
                    continue
                answered += 1
                assert not res.mixed_versions
                _check_rows(res, refs)
                mixed = c.predict(MODEL, nodes, sampling_width=0, allow_mixed_versions=True)
                _check_rows(mixed, refs)
    finally:
        stop.set()
        th.join(60)
    assert not errors, errors[0]
    assert answered + aborted == 12


# --------------------------------------------------------------------------- the plan alone (no server)
def _reply(req: pb.PredictRequest, graph_version: int) -> pb.PredictResponse:
    n = len(req.nodes) + len(req.new_nodes)
    return pb.PredictResponse(model="m", version="1", labels=[graph_version % 3] * n, num_classes=3,
                              probabilities=[1.0, 0.0, 0.0] * n, graph_version=graph_version)


def test_the_plan_sends_stale_chunks_again_and_splits_one_refused_for_its_size():
    """A version round's request refused for its work (an update grew it) is split in place; the result's rows
    all come from the newest version; with no update there is no round."""
    from clients import ResourceExhaustedError

    plan = PredictPlan(model="m", version="", nodes=np.arange(10, dtype=np.int64), new_nodes=[], knobs={},
                       return_probabilities=True, return_embeddings=False, request_id="r",
                       limits=ChunkLimits(max_nodes=4, num_classes=3))
    versions = iter([5, 5, 6])  # the third request saw an update
    sent = []
    while (req := plan.next_request()) is not None:
        sent.append(req)
        if len(sent) == 4:  # the first request of the round: refused for its work
            assert req.min_graph_version == 6 and list(req.nodes) == [0, 1, 2, 3]
            assert plan.shrink(ResourceExhaustedError("would aggregate about 400 edges, more than the limit of "
                                                      "200 per request"))
            continue
        plan.add(_reply(req, next(versions, 6)))
    assert [list(r.nodes) for r in sent[4:]] == [[0], [1], [2], [3], [4, 5, 6, 7]]
    assert [r.min_graph_version for r in sent] == [0, 5, 5, 6, 6, 6, 6, 6, 6]
    res = plan.result(1.0)
    assert res.graph_version == 6 and res.graph_versions.tolist() == [6] * 10 and res.timing.version_rounds == 1
    assert res.labels.tolist() == [0] * 10 and res.nodes.tolist() == list(range(10))


def test_result_types_default_to_no_per_row_versions():
    from clients import PredictResult, Settings, Timing

    res = PredictResult(labels=np.zeros(2, np.int64), probabilities=None, embeddings=None, settings=Settings(),
                        timing=Timing(), model="m", version="1", request_id="r", graph_version=3)
    assert not res.mixed_versions and "graph_versions" not in res.to_dict()
