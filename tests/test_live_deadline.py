"""The commit point of a graph update (serve.live ``LiveGraph._commit``): an update whose deadline passes while the
writer validates it, or builds its group's new graph, is refused DEADLINE_EXCEEDED and never applied; the rest of
its group commits exactly as if it had never been sent. Real servers on loopback over a copy of the tiny repository.

Before the fix the deadline was looked at only when the writer took the update: one whose validation outlasted it
was applied although its caller had been told DEADLINE_EXCEEDED, and the natural retry added a new node twice (a
production test: a new node with 13,000 neighbours and a 0.3 s deadline).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from clients import GnnClient, NewNode
from clients.errors import DeadlineExceededError

from .serving import ServerThread
from .test_live_replay import _wait, plain_repo  # noqa: F401  (a fixture)

pytestmark = pytest.mark.timeout(300)

BIG = 100  # neighbours of the slow update's new node: more than the group's oracle checks, so apply_edit validates it


def slow_validation(monkeypatch, seconds: float) -> threading.Event:
    """Make ``apply_edit`` of an edit with ``BIG`` or more new-node neighbours take ``seconds`` more (the validation
    of a large update on a large graph: seconds at 13,000 neighbours on a 13 k-node graph); the real edit runs
    after. The event is set when one starts."""
    import kernels.graph_edit as ge

    real = ge.apply_edit
    started = threading.Event()

    def slow(graph, edit, *a, **k):
        if len(edit.new_nbrs) >= BIG:
            started.set()
            time.sleep(seconds)
        return real(graph, edit, *a, **k)

    monkeypatch.setattr(ge, "apply_edit", slow)
    return started


def _big_node(f: int) -> NewNode:
    return NewNode(features=np.full(f, 0.123, np.float32), neighbors=list(range(3, 3 + BIG)))


def _non_edge(g) -> tuple[int, int]:
    """An edge the served graph ``g`` does not have."""
    for u in range(g.num_nodes):
        row = set(g.indices[g.indptr[u]:g.indptr[u + 1]].tolist())
        for v in range(u + 1, g.num_nodes):
            if v not in row:
                return u, v
    raise AssertionError("a complete graph")


def test_an_update_whose_validation_outlasts_its_deadline_is_not_applied(plain_repo, tiny_dataset,  # noqa: F811
                                                                          monkeypatch):
    """The writer takes the update at once (nothing before it), its validation then outlasts the deadline: the
    client gets DEADLINE_EXCEEDED and the update is not applied (it was, and the retry applied it twice)."""
    started = slow_validation(monkeypatch, 3.0)
    f, n0 = tiny_dataset.num_features, tiny_dataset.num_nodes
    with ServerThread(plain_repo, {"poll_s": 0}) as srv, GnnClient(srv.address, max_retries=0) as c:
        v0 = c.get_model("gcn").graph_version
        with pytest.raises(DeadlineExceededError):
            c.update_graph("gcn", new_nodes=[_big_node(f)], timeout=1.0)
        assert started.is_set()  # it was being validated when its deadline passed
        # an update after it: the writer answers it once it is done with the slow one
        up = c.update_graph("gcn", features={1: np.zeros(f, np.float32)}, timeout=60)
        info = c.get_model("gcn")
        assert up.graph_version == v0 + 1 and info.graph_version == v0 + 1, (v0, up.graph_version)
        assert info.num_nodes == n0  # the new node never landed
        retry = c.update_graph("gcn", new_nodes=[_big_node(f)], timeout=60)  # the retry a client makes
        assert list(retry.new_node_ids) == [n0] and c.get_model("gcn").num_nodes == n0 + 1


def test_a_group_with_an_expired_update_commits_the_others_as_if_it_had_never_been_sent(plain_repo,  # noqa: F811
                                                                                        tiny_dataset, monkeypatch):
    """Three updates taken as one group: the first (a new node with 100 neighbours and the edge ``e``) outlasts its
    deadline in validation. The two after it were validated with it in front of them: the second's new node would
    get the id after the first's, the third (the same edge) would be refused as a duplicate. Both are
    validated again without it: the second's node gets the first id, the third's edge is added, one version."""
    started = slow_validation(monkeypatch, 6.0)
    f, n0 = tiny_dataset.num_features, tiny_dataset.num_nodes
    with ServerThread(plain_repo, {"poll_s": 0}) as srv, GnnClient(srv.address, max_retries=0) as c:
        v0 = c.get_model("gcn").graph_version
        live = srv.server.registry.get("gcn").data.live
        e = _non_edge(live.data.graph)
        out: dict[str, object] = {}

        def send(key: str, timeout: float, **kw) -> None:
            try:
                out[key] = c.update_graph("gcn", timeout=timeout, **kw)
            except Exception as exc:
                out[key] = exc

        threads = [threading.Thread(target=send, args=("late", 5.0),
                                    kwargs={"new_nodes": [_big_node(f)], "add_edges": [e]})]
        threads.append(threading.Thread(target=send, args=("node", 60.0), kwargs={
            "new_nodes": [NewNode(features=np.full(f, 0.5, np.float32), neighbors=[1, 2])]}))
        threads.append(threading.Thread(target=send, args=("edge", 60.0), kwargs={"add_edges": [e]}))
        with live.writing():  # the writer is held (as by a model load): the three queue and form one group
            for t in threads:
                t.start()
                assert _wait(lambda k=len(live._pending) + 1: len(live._pending) >= k, 30)
        for t in threads:
            t.join(120)
        assert started.is_set()
        assert isinstance(out["late"], DeadlineExceededError), out["late"]
        node, edge = out["node"], out["edge"]
        assert not isinstance(node, Exception) and not isinstance(edge, Exception), (node, edge)
        assert list(node.new_node_ids) == [n0]  # as if the expired one had never been sent
        assert node.graph_version == edge.graph_version == v0 + 1
        info = c.get_model("gcn")
        assert info.graph_version == v0 + 1 and info.num_nodes == n0 + 1
        # the edge is there (adding it again is refused); the expired node is not
        with pytest.raises(Exception, match="already exists"):
            c.update_graph("gcn", add_edges=[e], timeout=60)
        c.update_graph("gcn", add_edges=[(n0, 50)], timeout=60)  # n0 is the live update's node: (n0, 50) is new


def test_a_shadow_update_whose_list_pushes_outlast_its_deadline_is_not_applied(tiny_repo, tmp_path, tiny_dataset,
                                                                               monkeypatch):
    """A shaDow graph's update spends most of its time in the PPR lists' pushes (``LivePPRIndex.prepare``), which ran
    after the log append: an update whose pushes outlasted its deadline was applied although its client was told
    DEADLINE_EXCEEDED (the production tester's new node with 13,000 neighbours). The pushes now run before the
    commit point and change nothing until installed: the update is refused, the lists and their bounds are as
    before, and answers after it equal those before it to the bit."""
    import shutil

    from kernels.ppr_live import LivePPRIndex

    repo = tmp_path / "ppr"
    shutil.copytree(tiny_repo, repo, ignore=shutil.ignore_patterns("_live", "_ppr"))
    real = LivePPRIndex.prepare
    started = threading.Event()
    slow = {"on": False}

    def prepare(self, *a, **k):
        if slow["on"]:
            started.set()
            time.sleep(3.0)
        return real(self, *a, **k)

    monkeypatch.setattr(LivePPRIndex, "prepare", prepare)
    f, n0 = tiny_dataset.num_features, tiny_dataset.num_nodes
    nodes = np.arange(n0)
    with ServerThread(repo, {"poll_s": 0}) as srv, GnnClient(srv.address, max_retries=0) as c:
        v0 = c.get_model("shadow").graph_version
        live = srv.server.registry.get("shadow").data.live
        (idx,) = live.data.ppr_indexes.values()
        drift = idx._drift.copy()
        before = c.predict("shadow", nodes, sampling_width=3).probabilities
        slow["on"] = True
        with pytest.raises(DeadlineExceededError):
            c.update_graph("shadow", new_nodes=[NewNode(features=np.full(f, 0.5, np.float32),
                                                        neighbors=list(range(3, 40)))], timeout=1.0)
        assert started.is_set()
        slow["on"] = False
        # an update after it (node 1's features, unchanged): answered once the writer is done with the slow one
        up = c.update_graph("shadow", features={1: np.asarray(tiny_dataset.x[1], np.float32)}, timeout=60)
        assert up.graph_version == v0 + 1 and c.get_model("shadow").num_nodes == n0  # the new node never landed
        np.testing.assert_array_equal(idx._drift[: len(drift)], drift)
        np.testing.assert_array_equal(c.predict("shadow", nodes, sampling_width=3).probabilities, before)
