"""Edge weights through the server: one rule everywhere, errors in the request's own words.

Every edge weight a request brings (a Predict new node's ``edge_weights``, an UpdateGraph new node's
``edge_weights``, an ``add_edges`` entry's ``weight``) must be finite and >= 0, the rule of
``CSRGraph.from_edge_index``: 0 is an edge that adds nothing (GCN's degree is 1 + the sum of the
weights). A refusal names the field the client filled in (``add_edges[i]``,
``new_nodes[j].edge_weights[i]``), never the kernel's arrays. Real models of the tiny repository, a
real server on loopback with a writable graph.
"""

from __future__ import annotations

import shutil

import grpc
import numpy as np
import pytest

import clients
from clients import GnnClient, NewNode
from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pb_grpc

from .serving import ServerThread


@pytest.fixture
def server(tiny_repo, tmp_path):
    """A server of its own (its own update log) over the tiny repository's models."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("gcn", "shadow", "_data"):
        (repo / name).symlink_to(tiny_repo / name)
    if (tiny_repo / "_ppr").exists():
        shutil.copytree(tiny_repo / "_ppr", repo / "_ppr")
    srv = ServerThread(repo).start()
    yield srv
    srv.stop()


def _non_neighbour(ds, u: int) -> int:
    nbrs = set(ds.graph.neighbors(u).tolist())
    return next(v for v in range(1, ds.num_nodes) if v != u and v not in nbrs)


def _update_error(addr: str, request: pb.UpdateGraphRequest) -> str:
    with grpc.insecure_channel(addr) as ch, pytest.raises(grpc.RpcError) as ei:
        pb_grpc.GnnServiceStub(ch).UpdateGraph(request, timeout=60)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return ei.value.details()


def test_bad_weights_are_named_by_the_request_field(server, tiny_dataset):
    ds = tiny_dataset
    v = _non_neighbour(ds, 0)
    f = np.zeros(ds.num_features)
    # the request as any client sends it: the second added edge, to the update's new node, weighs NaN
    details = _update_error(server.address, pb.UpdateGraphRequest(
        model="gcn", new_nodes=[pb.NewNode(features=f.tolist(), neighbors=[3])],
        add_edges=[pb.Edge(src=0, dst=v, weight=2.0), pb.Edge(src=0, dst=ds.num_nodes, weight=float("nan"))]))
    assert f"add_edges[1]: weight nan of edge (0, {ds.num_nodes}) must be finite and >= 0" in details, details
    assert "add_w" not in details
    with GnnClient(server.address, timeout=60) as c:
        with pytest.raises(clients.InvalidArgumentError) as ei:
            c.update_graph("gcn", add_edges=[(0, v, -0.5)])
        assert f"add_edges[0]: weight -0.5 of edge (0, {v}) must be finite and >= 0" in str(ei.value)
        assert "add_w" not in str(ei.value)
        with pytest.raises(clients.InvalidArgumentError, match=r"new_nodes\[1\]\.edge_weights\[1\]: weight -1\.0 of edge "
                                                               rf"\({ds.num_nodes + 1}, 4\) must be finite and >= 0"):
            c.update_graph("gcn", new_nodes=[NewNode(f, [3]), NewNode(f, [2, 4], [1.0, -1.0])])
        with pytest.raises(clients.InvalidArgumentError,
                           match=r"new_nodes\[0\]\.edge_weights\[0\]: weight inf of the edge to node 2 must be finite"):
            c.predict_new_node("gcn", f, [2, 4], [np.inf, 1.0])
        assert c.get_model("gcn").graph_version == 0, "nothing of a refused update lands"


def test_zero_weights_are_taken_everywhere(server, tiny_dataset):
    ds = tiny_dataset
    a, b = 5, 9
    x = ds.x[11]
    with GnnClient(server.address, timeout=60) as c:
        # Predict with a new node: a 0-weight edge adds nothing to GCN (degree 1 + sum of weights), so the
        # node answers as if it had only its other edge
        zero = c.predict_new_node("gcn", x, [a, b], [0.0, 1.0], sampling_width=0)
        only_b = c.predict_new_node("gcn", x, [b], [1.0], sampling_width=0)
        np.testing.assert_allclose(zero.probabilities, only_b.probabilities, atol=1e-6)
        assert zero.settings.edges_total > only_b.settings.edges_total, "the 0-weight edge is an edge"
        res = c.predict_new_node("shadow", x, [a, b], [0.0, 0.0])
        assert np.isfinite(res.probabilities).all() and len(res.labels) == 1
        # UpdateGraph: a new node's 0-weight edge and a 0-weight added edge are applied
        v = _non_neighbour(ds, a)
        up = c.update_graph("gcn", new_nodes=[NewNode(x, [a, b], [0.0, 1.0])], add_edges=[(a, v, 0.0)])
        assert up.graph_version == 1 and up.num_edges == ds.graph.num_edges + 6
        new = int(up.new_node_ids[0])
        after = c.predict("gcn", [new], sampling_width=0, min_graph_version=1)
        np.testing.assert_allclose(after.probabilities, only_b.probabilities, atol=1e-6)
