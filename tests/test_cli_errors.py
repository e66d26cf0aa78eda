"""The ``gnnserve`` command on bad input, against real servers on loopback: one line on stderr naming the
problem and a non-zero exit code, never a traceback, a hang or a wrong answer.

Covers ``predict`` (ids beyond int64, a bare ``--server`` host, the graph version in the output),
``update`` (values of the wrong JSON type, booleans as ids, a multi-line file stopping on a refused
update), ``bench`` (bad arguments, a dataset that is not the model's, server-side errors), ``serve`` (a
missing repository, busy ports) and the repository poller's warning about bad version directories.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from clients import GnnClient, cli
from clients.errors import GnnServeError
from serve.cli import main as gnnserve

from .serving import REPO_ROOT, ServerThread, free_port, make_repo, no_traceback, tiny_dataset

TOO_BIG = "18446744073709551617"  # 2**64 + 1


def _dead_address() -> str:
    return f"127.0.0.1:{free_port()}"


# --------------------------------------------------------------------------- a served graph of our own
@pytest.fixture(scope="module")
def dataset():
    return tiny_dataset()


@pytest.fixture(scope="module")
def repo(tmp_path_factory, dataset) -> Path:
    """A GCN on the tiny graph, in a repository of this module's (its updates change the graph)."""
    return make_repo(tmp_path_factory.mktemp("cli-errors-repo"), dataset, {"gcn": "gcn"})


@pytest.fixture(scope="module")
def addr(repo):
    srv = ServerThread(repo).start()
    yield srv.address
    srv.stop()


def _graph_version(addr: str) -> int:
    with GnnClient(addr, timeout=60) as c:
        return c.get_model("gcn").graph_version


def _absent_edges(dataset, count: int, first: int) -> list[tuple[int, int]]:
    """Pairs of nodes with no edge between them in the tiny graph, from node ``first`` on (each test its
    own nodes: the graph is shared by the module's tests, and updates change it)."""
    g = dataset.graph
    out = []
    for u in range(first, dataset.num_nodes):
        row = set(g.indices[g.indptr[u]:g.indptr[u + 1]].tolist())
        v = next(v for v in range(u + 1, dataset.num_nodes) if v not in row)
        out.append((u, v))
        if len(out) == count:
            return out
    raise AssertionError("no absent edges")


# --------------------------------------------------------------------------- predict
def test_node_ids_beyond_int64_are_a_usage_error(tmp_path, capsys):
    assert cli.parse_nodes(str(cli.INT64_MAX)).tolist() == [cli.INT64_MAX]
    for spec in (TOO_BIG, f"1,{TOO_BIG}", f"0-{TOO_BIG}", "9223372036854775808", "0" * 30 + TOO_BIG):
        with pytest.raises(cli.NodeSpecError, match="must fit int64"):
            cli.parse_nodes(spec)
    with pytest.raises(cli.NodeSpecError, match="is not a node id"):
        cli.parse_nodes("\u00b2")  # a superscript two: str.isdigit() says yes, int() says no
    ids = tmp_path / "ids.txt"
    ids.write_text(f"1\n{TOO_BIG}\n")
    for spec in (TOO_BIG, f"@{ids}"):
        rc = cli.predict_main(["--server", _dead_address(), "--model", "m", "--nodes", spec])
        err = capsys.readouterr().err
        assert rc == 2 and "must fit int64" in err and len(err.strip().splitlines()) == 1, err
        no_traceback(err)
    assert f"{ids}:2" in err  # the file and line of the bad id


@pytest.mark.parametrize("given,expected", [
    ("localhost", "localhost:8500"),
    ("  10.0.0.7 ", "10.0.0.7:8500"),
    ("localhost:9000", "localhost:9000"),
    ("[::1]", "[::1]:8500"),
    ("[::1]:9000", "[::1]:9000"),
    ("::1", "[::1]:8500"),
    ("grpcs://example.org", "grpcs://example.org:8500"),
    ("grpc://example.org:7000", "grpc://example.org:7000"),
    ("unix:/tmp/gnnserve.sock", "unix:/tmp/gnnserve.sock"),
    ("dns:///example.org:9000", "dns:///example.org:9000"),
])
def test_server_address_gets_the_default_port(given, expected):
    assert cli.server_address(given) == expected


@pytest.mark.parametrize("given,msg", [
    ("localhost:abc", "port must be a number"),
    ("localhost:", "port must be a number"),
    ("localhost:70000", "port must be a number"),
    (":8500", "no host"),
    ("", "is empty"),
    ("fe80::1:8500:x", "is written [ADDRESS]:PORT"),
])
def test_bad_server_address_is_a_usage_error(given, msg, capsys):
    with pytest.raises(ValueError, match=re.escape(msg)):
        cli.server_address(given)
    rc = cli.predict_main(["--server", given, "--model", "m", "--nodes", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err, err
    no_traceback(err)


def test_bare_host_connects_to_port_8500_not_443(capsys):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 8500))
        except OSError:
            pytest.skip("port 8500 is in use here")
    rc = cli.predict_main(["--server", "localhost", "--model", "m", "--nodes", "1", "--retries", "0", "--timeout", "5"])
    err = capsys.readouterr().err
    assert rc == 1 and "UNAVAILABLE" in err and ":8500" in err and ":443" not in err, err


def test_predict_output_carries_the_graph_version(addr, dataset, capsys):
    (u, v), = _absent_edges(dataset, 1, first=100)
    with GnnClient(addr, timeout=60) as c:
        version = c.update_graph("gcn", add_edges=[(u, v)]).graph_version
        ref = c.predict("gcn", [u, v], min_graph_version=version)
    assert version >= 1
    assert gnnserve(["predict", "--server", addr, "--model", "gcn", "--nodes", f"{u},{v}", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["graph_version"] == ref.graph_version >= version and doc["labels"] == ref.labels.tolist()
    assert doc["served_by"] == getattr(ref, "served_by", "")
    assert gnnserve(["predict", "--server", addr, "--model", "gcn", "--nodes", f"{u},{v}"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("model gcn  version 1  ") and f"graph version {ref.graph_version} " in head, head


# --------------------------------------------------------------------------- update
@pytest.mark.parametrize("line,msg", [
    ('{"features": {"7": "abc"}}', "features['7']: expected a list of numbers"),
    ('{"features": {"7": [0.5, "abc"]}}', "features['7'][1]: \"abc\" is not a number"),
    ('{"features": {"x7": [0.5]}}', "key 'x7' is not a node id"),
    ('{"features": {"' + TOO_BIG + '": [0.5]}}', "must fit int64"),
    ('{"features": [0.5]}', "features must be an object"),
    ('{"add_edges": [[true, 2]]}', "add_edges[0][0]: true is not a node id"),
    ('{"add_edges": [[1, false]]}', "add_edges[0][1]: false is not a node id"),
    ('{"remove_edges": [[1.0, 2]]}', "remove_edges[0][0]: 1.0 is not a node id"),
    ('{"add_edges": [[-1, 2]]}', "node ids are non-negative"),
    ('{"add_edges": [[1, ' + TOO_BIG + ']]}', "must fit int64"),
    ('{"add_edges": [[1, 2, true]]}', "add_edges[0][2]: true is not a number"),
    ('{"add_edges": [[1, 2, 3, 4]]}', "an edge is [u, v] or [u, v, weight]"),
    ('{"remove_edges": [[1, 2, 0.5]]}', "an edge is [u, v]"),
    ('{"add_edges": [1, 2]}', "add_edges[0]: an edge is"),
    ('{"new_nodes": [{"features": [0.1], "neighbors": [true]}]}', "new_nodes[0].neighbors[0]: true is not a node id"),
    ('{"new_nodes": [{"features": "abc", "neighbors": [1]}]}', "new_nodes[0].features: expected a list"),
    ('{"new_nodes": [{"neighbors": [1]}]}', "a new node is an object"),
    ('{"new_nodes": [{"features": [0.1], "neigbors": [1]}]}', "unknown field(s) ['neigbors']"),
    ('{"expect_graph_version": true}', "expect_graph_version must be a non-negative integer"),
    ('{"request_id": 7}', "request_id must be a string"),
    ('{"features": {"7": [0.5], "07": [0.25]}}', "features: node 7 appears twice (key '07')"),
    ('{"features": {"7": [0.5], "7": [0.25]}}', "key '7' appears twice in one object"),
    ('{"add_edges": [[1, 2]], "add_edges": [[3, 4]]}', "key 'add_edges' appears twice"),
])
def test_update_values_of_the_wrong_type_are_refused_before_anything_is_sent(addr, dataset, tmp_path, capsys, line,
                                                                            msg):
    before = _graph_version(addr)
    f = tmp_path / "up.jsonl"
    good = {"features": {"5": dataset.x[5].tolist()}}  # a valid first line: it must not be sent either
    f.write_text(json.dumps(good) + "\n\n" + line + "\n")
    rc = cli.update_main(["--server", addr, "--model", "gcn", str(f)])
    captured = capsys.readouterr()
    assert rc == 2 and f"{f}:3: " in captured.err and msg in captured.err, captured.err
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""
    no_traceback(captured.err)
    assert _graph_version(addr) == before  # nothing applied, not even line 1


def test_update_booleans_are_not_node_one(addr, dataset, tmp_path, capsys):
    """`true` used to be sent as node 1: the edge (1, v) was added to the graph."""
    before = _graph_version(addr)
    f = tmp_path / "up.jsonl"
    f.write_text('{"add_edges": [[true, 2]]}\n')
    assert cli.update_main(["--server", addr, "--model", "gcn", str(f)]) == 2
    assert "true is not a node id" in capsys.readouterr().err
    assert _graph_version(addr) == before


def test_multi_line_update_says_where_it_stopped(addr, dataset, tmp_path, capsys):
    (a, b), (c, d), (e, g) = _absent_edges(dataset, 3, first=200)
    lines = [{"add_edges": [[a, b]]}, {"add_edges": [[c, d]]}, {"add_edges": [[a, b]]},  # already added
             {"add_edges": [[e, g]]}, {"remove_edges": [[e, g]]}]
    f = tmp_path / "up.jsonl"
    f.write_text("# three good updates, then a refused one\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    before = _graph_version(addr)
    rc = cli.update_main(["--server", addr, "--model", "gcn", str(f)])
    out, err = capsys.readouterr()
    applied = [int(x.split()[2].rstrip(":")) for x in out.splitlines()]
    assert rc == 2 and len(applied) == 2 and applied[-1] == _graph_version(addr) > before, out
    assert f"{f}:4: INVALID_ARGUMENT" in err and "already exists" in err, err
    assert (f"stopped at {f}:4 (update 3 of 5): the 2 earlier updates were applied (graph version {applied[-1]}); "
            "this one was not; the 2 updates after it were not sent") in err, err
    no_traceback(err)
    with GnnClient(addr, timeout=60) as client:  # line 5's edge was not sent: adding it now works
        client.update_graph("gcn", add_edges=[(e, g)])

    f.write_text(json.dumps({"remove_edges": [[a, b]]}) + "\n" + json.dumps({"remove_edges": [[a, b]]}) + "\n")
    assert cli.update_main(["--server", addr, "--model", "gcn", "--json", str(f)]) == 2
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and json.loads(out)["graph_version"] == _graph_version(addr)
    assert f"stopped at {f}:2 (update 2 of 2): the 1 earlier update was applied" in err
    assert "it was the last one" in err, err

    f.write_text(json.dumps([{"remove_edges": [[a, b]]}, {"add_edges": [[a, b]]}]))  # a JSON array
    assert cli.update_main(["--server", addr, "--model", "gcn", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"stopped at {f}: item 0 (update 1 of 2): no earlier update was applied" in err
    assert "the 1 update after it was not sent" in err, err


# --------------------------------------------------------------------------- bench
@pytest.mark.parametrize("args,msg", [
    (["--widths", "4,abc"], "'abc' in '4,abc' is not an integer"),
    (["--widths=-3"], "sampling width -3"),
    (["--budgets", "0"], "PPR budget 0"),
    (["--queries", "0"], "argument --queries: must be >= 1, got 0"),
    (["--eval-nodes", "-5"], "argument --eval-nodes: must be >= 1"),
])
def test_bench_bad_arguments_exit_2(args, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        gnnserve(["bench", "--server", _dead_address(), "--model", "gcn", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and msg in err, err
    no_traceback(err)


def test_bench_refuses_a_dataset_of_another_graph(addr, tmp_path, capsys):
    from kernels.datasets import save_npz, synthetic_sbm

    other = tmp_path / "other.npz"
    save_npz(synthetic_sbm(1200, num_classes=4, avg_degree=8, num_features=16, seed=5, name="other"), other)
    rc = gnnserve(["bench", "--server", addr, "--model", "gcn", "--dataset", str(other), "--queries", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and f"--dataset {str(other)!r}" in err and "is not the data model 'gcn' serves" in err, err
    assert len(err.strip().splitlines()) == 1
    no_traceback(err)


def test_bench_server_and_setup_errors_are_one_line(addr, repo, tmp_path, capsys):
    for args, rc_want, msg in [
        (["--server", addr, "--model", "nope"], 1, "NOT_FOUND: model 'nope' not found"),
        (["--server", addr, "--model", "gcn", "--widths", "5000000000"], 2, "INVALID_ARGUMENT: sampling_width must fit"),
        (["--server", "localhost:abc", "--model", "gcn"], 2, "port must be a number"),
        (["--repo", str(tmp_path / "nope"), "--model", "gcn"], 2, "is not a directory"),
        (["--server", addr, "--model", "gcn", "--dataset", str(tmp_path / "nope.npz")], 2, "nope.npz"),
        (["--server", addr, "--model", "gcn", "--plot", str(tmp_path / "no" / "dir" / "c.png")], 2, "does not exist"),
    ]:
        rc = gnnserve(["bench", "--queries", "2", *args])
        err = capsys.readouterr().err
        assert rc == rc_want and msg in err and len(err.strip().splitlines()) == 1, (args, err)
        no_traceback(err)


def test_bench_runs_with_the_models_own_dataset(addr, repo, tmp_path, capsys):
    data = next((repo / "_data").iterdir())
    png = tmp_path / "curve.png"
    rc = gnnserve(["bench", "--server", addr, "--model", "gcn", "--dataset", str(data), "--queries", "2",
                   "--eval-nodes", "30", "--widths", "0,4,4", "--json", "--plot", str(png)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    rows = json.loads(captured.out)
    assert [r["sampling_width"] for r in rows] == [0, 4] and all(0 <= r["accuracy"] <= 1 for r in rows)
    # integers as integers, the accuracy's source a word (a new-user report: 0.0, 1.0 and an undocumented 1.0)
    assert all(type(r["sampling_width"]) is int and type(r["ppr_budget"]) is int and r["ppr_budget"] == 0
               and r["accuracy_source"] == "test" and 0 < r["edges_kept"] <= 1 for r in rows), rows
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc = gnnserve(["bench", "--server", addr, "--model", "gcn", "--queries", "2", "--widths", "4", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    row, = json.loads(captured.out)
    assert (row["sampling_width"], row["ppr_budget"], row["accuracy_source"]) == (4, 0, "knob-table"), row
    assert '"sampling_width": 4,' in captured.out  # not 4.0


# --------------------------------------------------------------------------- serve
def _serve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "serve.cli", "serve", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_serve_missing_repository_is_one_line(tmp_path):
    for repo, why in ((tmp_path / "nonexistent", "does not exist"), (tmp_path / "file", "is not a directory")):
        if repo.name == "file":
            repo.write_text("x")
        proc = _serve("--repo", str(repo), "--port", "0")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"gnnserve serve: model repository {str(repo)!r} {why} (--repo: a directory of <name>/<version>/ "
            "checkpoints, written by 'gnnserve train --out REPO/<name>/<version>')"], proc.stderr


@pytest.mark.parametrize(("flags", "msg"), [
    (["--max-batch-targets", "0"], "--max-batch-targets must be >= 1 and finite, got 0"),
    (["--max-delay-ms", "-5"], "--max-delay-ms must be >= 0 and finite, got -5.0"),
    (["--ppr-refresh-tolerance", "-1"], "--ppr-refresh-tolerance must be > 0 and finite"),
    (["--hot-bytes", "-1"], "--hot-bytes must be >= 0 and finite, got -1"),
    (["--workers", "0"], "--workers must be >= 1 and finite, got 0"),
    (["--max-concurrent-rpcs", "0"], "--max-concurrent-rpcs must be >= 1 and finite, got 0"),
    (["--max-nodes-per-request", "0"], "--max-nodes-per-request must be >= 1 and finite, got 0"),
    (["--grace-s", "-1"], "--grace-s must be >= 0 and finite, got -1.0"),
    (["--poll-s", "-1"], "--poll-s must be >= 0 and finite, got -1.0"),
    (["--hot-fraction", "2"], "--hot-fraction must lie in [0, 1], got 2.0"),
    (["--read-your-writes-timeout-s", "nan"], "--read-your-writes-timeout-s must be >= 0 and finite, got nan"),
    (["--log-level", "BOGUS"], "--log-level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'BOGUS'"),
    (["--processes", "0"], "--processes must be >= 1, got 0"),
    (["--precompile-jobs", "-1"], "--precompile-jobs must be >= 0 (0: never), got -1"),
    (["--torch-path-threads", "-1"], "--torch-path-threads must be >= 0 (0: torch's own count for large batches), "
                                     "got -1"),
    (["--ppr-eager-lists", "-2"], "--ppr-eager-lists must be >= 0, or -1 (every list in the update), got -2"),
    (["--serving-path", "plain-resident", "--no-resident"], "--serving-path plain-resident needs the resident state"),
])
def test_serve_flags_out_of_range_are_one_line_before_anything_starts(tmp_path, capsys, flags, msg):
    """A new-user audit: these started a server whose every model was then refused in the components' own names
    (max_delay_s, tol_factor, budget_bytes), kept it running NOT_SERVING, or ended in a traceback (--log-level)."""
    from serve.cli import main

    rc = main(["serve", "--repo", str(tmp_path), "--port", "0", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"gnnserve serve: {msg}"), err


def test_serve_busy_ports_are_one_line_naming_the_port(repo):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve("--repo", str(repo), "--port", str(port))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"gnnserve serve: cannot listen on 127.0.0.1:{port} (--host/--port, gRPC): Address already in use"]
        proc = _serve("--repo", str(repo), "--port", "0", "--metrics-port", str(port))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"gnnserve serve: cannot serve metrics on 127.0.0.1:{port} (--metrics-port): Address already in use"]
    proc = _serve("--repo", str(repo), "--port", "70000")
    assert proc.returncode == 2 and "argument --port: 70000 is not a port number" in proc.stderr
    no_traceback(proc.stderr)


def test_bind_failures_after_the_check_name_the_port():
    """A port taken between the start-up check and the bind: the errors gRPC and the metrics endpoint
    raise then are turned into the same line."""
    from concurrent import futures

    import grpc
    from prometheus_client import CollectorRegistry, start_http_server

    from serve.cli import _start_failure

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = type("Args", (), {"host": "127.0.0.1", "port": port, "metrics_port": None})()
        server = grpc.server(futures.ThreadPoolExecutor(1), options=[("grpc.so_reuseport", 0)])
        with pytest.raises(RuntimeError) as grpc_exc:
            server.add_insecure_port(f"127.0.0.1:{port}")
        assert _start_failure(grpc_exc.value, args) == (
            f"cannot listen on 127.0.0.1:{port} (--host/--port, gRPC): Address already in use")
        args.port, args.metrics_port = 8500, port
        with pytest.raises(OSError) as http_exc:
            start_http_server(port, addr="127.0.0.1", registry=CollectorRegistry())
        assert _start_failure(http_exc.value, args) == (
            f"cannot serve metrics on 127.0.0.1:{port} (--metrics-port): Address already in use")
    assert _start_failure(FileNotFoundError(2, "No such file or directory", "cert.pem"), args) is None


# --------------------------------------------------------------------------- the repository poller
def _ignored_logged(caplog, path: Path) -> int:
    return sum(f"ignoring {path}: version directories" in r.getMessage() for r in caplog.records)


def test_bad_version_directory_is_logged_once_not_at_every_poll(tmp_path, caplog):
    repo = tmp_path / "repo"
    (repo / "syn" / "abc").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="serve.registry"):
        srv = ServerThread(repo, {"poll_s": 0.05}).start()
        try:
            time.sleep(1.0)  # about 20 polls
        finally:
            srv.stop()
    assert _ignored_logged(caplog, repo / "syn" / "abc") == 1


def test_bad_version_directory_is_logged_again_when_it_comes_back(tmp_path, caplog):
    from serve.registry import ModelRegistry

    repo = tmp_path / "repo"
    bad = repo / "syn" / "abc"
    bad.mkdir(parents=True)
    registry = ModelRegistry(repo)
    with caplog.at_level(logging.WARNING, logger="serve.registry"):
        for _ in range(3):
            assert registry.scan() == {}
        assert _ignored_logged(caplog, bad) == 1
        bad.rmdir()
        registry.scan()
        bad.mkdir()
        (repo / "syn" / "0").mkdir()
        (repo / "syn" / "2").mkdir()
        for _ in range(3):
            assert registry.scan() == {"syn": {2: repo / "syn" / "2"}}
    assert _ignored_logged(caplog, bad) == 2 and _ignored_logged(caplog, repo / "syn" / "0") == 1


def test_the_sdk_gives_a_bare_host_gnnserves_port(tiny_repo):
    # GnnClient("localhost") once dialled port 443 (gRPC's default for a bare name); the SDK and the CLI
    # share one address rule, and a real server on 127.0.0.1 answers "127.0.0.1:<its port>" as it did
    with GnnClient("localhost") as c:
        assert c._config.target == "localhost:8500"
    with GnnClient("grpc://[::1]") as c:
        assert c._config.target == "[::1]:8500"
    with GnnClient("unix:/tmp/gnnserve.sock") as c:
        assert c._config.target == "unix:/tmp/gnnserve.sock"
    with pytest.raises(ValueError, match="port must be a number"):
        GnnClient("localhost:http")
    with ServerThread(tiny_repo, {"poll_s": 0}) as srv, GnnClient(srv.address) as c:
        res = c.predict("gcn", [1, 2])
        assert res.served_by == str(os.getpid())  # the process that answered, in the SDK's result
        assert res.to_dict()["served_by"] == res.served_by and res.to_dict()["graph_version"] == 0


def test_the_servers_log_handler_follows_sys_stderr(monkeypatch):
    """setup_logging's handler writes to sys.stderr as it is at each record: a stream that was sys.stderr when
    logging was set up and has been closed since (a test's capture around an in-process main) is never written."""
    import io
    import logging
    import sys

    from serve.cli import setup_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        first = io.StringIO()
        monkeypatch.setattr(sys, "stderr", first)
        setup_logging("INFO")
        first.close()
        now = io.StringIO()
        monkeypatch.setattr(sys, "stderr", now)
        logging.getLogger("gnnserve.test").info("after the first stream closed")
        out = now.getvalue()
        assert "INFO gnnserve.test: after the first stream closed" in out and "Logging error" not in out, out
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


# --------------------------------------------------------------------------- a new-user walkthrough's findings
def test_models_table_shows_the_graph_version_update_points_to(addr, dataset, capsys):
    """``gnnserve update`` sends a user whose update may or may not have been applied to the graph version in
    ``gnnserve models``: the table shows it (it was in ``--json`` only), and read-only models say so."""
    import dataclasses

    (u, v), = _absent_edges(dataset, 1, first=300)
    with GnnClient(addr, timeout=60) as c:
        version = c.update_graph("gcn", add_edges=[(u, v)]).graph_version
        info = c.get_model("gcn")
    assert cli.models_main(["--server", addr]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("gcn  version 1 ") and header.endswith(f"  ready  graph version {version}"), header
    assert "read-only" not in header
    assert cli.format_model(dataclasses.replace(info, read_only=True)).splitlines()[0].endswith(
        f"graph version {version}  read-only (updates refused)")
    # the message that sends the user there, for an update whose answer was lost
    lost = GnnServeError("Deadline Exceeded", code=grpc.StatusCode.DEADLINE_EXCEEDED)
    assert "(see the graph version 'gnnserve models' shows)" in cli._stopped_at("f:1", 0, 1, None, lost)
    assert "(see the graph version 'gnnserve models' shows: above 7 if it was, unless another client updated the " \
           "graph meanwhile)" in cli._stopped_at("f:2", 1, 2, 7, lost)


def test_predict_takes_version_latest_as_its_help_says(addr, capsys):
    """``--version VERSION  model version (default: latest)``, but ``--version latest`` was NOT_FOUND (the server
    knows versions by number only, docs/RELIABILITY.md): the command takes the word for the newest version."""
    assert "'latest'" in cli._predict_parser().format_help()
    for word in ("latest", "LATEST"):
        assert cli.predict_main(["--server", addr, "--model", "gcn", "--nodes", "1", "--version", word, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["version"] == "1"
    assert cli.predict_main(["--server", addr, "--model", "gcn", "--nodes", "1", "--version", "7"]) == 1
    assert "NOT_FOUND: model 'gcn' has no version 7" in capsys.readouterr().err


def test_client_options_are_never_abbreviated(capsys):
    """argparse's prefix matching read ``--k 32`` as ``--key 32`` (the TLS key file)."""
    for main, args in ((cli.predict_main, ["--nodes", "1"]), (cli.models_main, []),
                       (cli.update_main, ["-"])):
        assert main(["--server", _dead_address(), "--model", "m", *args, "--k", "32"]) == 2
        assert "error: unrecognized arguments: --k 32" in capsys.readouterr().err


def test_healthcheck_takes_server_and_says_when_a_service_is_unknown(addr, capsys):
    """``python -m serve.healthcheck --server HOST:PORT`` was read as ``--server-name`` (prefix matching) and probed
    the default address; ``--service nosuch`` printed ``UNREACHABLE: NOT_FOUND:`` with nothing after it."""
    from serve import healthcheck
    from serve.server import GNN_SERVICE, TRITON_SERVICE

    assert healthcheck.SERVICES == ("", GNN_SERVICE, TRITON_SERVICE)
    for service in healthcheck.SERVICES:
        assert healthcheck.main(["--server", addr, "--service", service, "--timeout", "20"]) == 0
        assert capsys.readouterr().out.strip() == "SERVING"
    assert healthcheck.main(["--address", addr, "--timeout", "20"]) == 0
    assert capsys.readouterr().out.strip() == "SERVING"
    assert healthcheck.main(["--server", addr, "--service", "nosuch", "--timeout", "20"]) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"SERVICE_UNKNOWN: the server at {addr} is reachable but has no health status for service "
                          "'nosuch' (a gnnserve server has '', 'gnnserve.v1.GnnService', "
                          "'inference.GRPCInferenceService'"), out
    assert [healthcheck.address_of(a) for a in ("localhost", addr, "[::1]:9", "unix:/tmp/s")] == [
        "localhost:8500", addr, "[::1]:9", "unix:/tmp/s"]  # a bare host: gnnserve's port, as the client commands
    with pytest.raises(SystemExit) as exc:  # no abbreviations: --serv is no option
        healthcheck.main(["--serv", addr])
    assert exc.value.code == 2 and "unrecognized arguments: --serv" in capsys.readouterr().err


def test_serve_refuses_a_data_path_that_does_not_exist(tmp_path, repo, capsys):
    """A mistyped ``--data`` was silently ignored whenever the checkpoint's recorded dataset was still there."""
    from serve.cli import _data_problem, main

    data = str(next((repo / "_data").iterdir()))
    for bad in ([str(tmp_path / "nope.npz")], [data, str(tmp_path / "nope.npz")]):
        rc = main(["serve", "--repo", str(repo), "--port", "0", *(a for p in bad for a in ("--data", p))])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err == [f"gnnserve serve: --data {str(tmp_path / 'nope.npz')!r} does not exist (--data "
                                   "takes a .npz file, a saved dataset directory, ogb:NAME[@ROOT] or synthetic[:N...]; "
                                   "repeat it for several)"], err
    # what it takes stays accepted: a dataset directory, a .npz file, specs that name no path
    npz = tmp_path / "d.npz"
    npz.write_bytes(b"")
    assert _data_problem([data, str(npz), "synthetic:100", "synthetic", "ogb:ogbn-arxiv@/not/yet"]) is None


def test_train_warns_when_out_is_not_a_version_a_server_serves(tmp_path, capsys):
    """``gnnserve train --out REPO/x/0`` succeeded and no server ever served version 0. --out may be any
    checkpoint directory (export-onnx and serve.knob_timing take one anywhere), so this is a warning, said
    before training, naming a version that would be served; a plain directory gets none."""
    from models.train import version_problem

    base = ["train", "--dataset", "synthetic:300", "--model", "gcn", "--epochs", "2", "--no-progress",
            "--knob-widths", "0"]
    out = tmp_path / "repo" / "x" / "0"
    assert gnnserve([*base, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    want = (f"gnnserve train: warning: --out {str(out)!r}: a server serves REPO/<name>/<version> with a positive "
            f"integer version, and ignores '0'; to serve this checkpoint, write it to {str(out.parent / '1')!r}")
    assert want in err.splitlines(), err
    assert (out / "config.json").exists()
    (tmp_path / "repo" / "x" / "3").mkdir()
    assert version_problem(tmp_path / "repo" / "x" / "v2").endswith(f"{str(out.parent / '4')!r}")
    (tmp_path / "repo" / "_data").mkdir()
    assert "ignores 'ckpt'" in version_problem(tmp_path / "repo" / "y" / "ckpt")
    for fine in (tmp_path / "repo" / "x" / "4", tmp_path / "standalone", tmp_path / "repo" / "x" / "01"):
        assert version_problem(fine) is None, fine


def test_train_logs_numba_compilations(tmp_path, monkeypatch, capsys):
    """The first ``gnnserve train`` on a machine compiled kernels for minutes without a line saying so; the
    server and the demo log each compilation (kernels.compile_log), and training now does too."""
    import numba
    import numpy as np

    import models.train as train_module

    real = train_module.load_dataset

    def load_and_compile(spec, **kw):  # a kernel no cache holds, compiled inside the run
        @numba.njit(cache=False)
        def _fresh_kernel(a):
            return a.sum() + 1.0

        assert _fresh_kernel(np.arange(3.0)) == 4.0
        return real(spec, **kw)

    monkeypatch.setattr(train_module, "load_dataset", load_and_compile)
    rc = gnnserve(["train", "--dataset", "synthetic:300", "--model", "gcn", "--epochs", "2", "--no-progress",
                   "--knob-widths", "0", "--out", str(tmp_path / "ck")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert re.search(r"kernels\.compile_log: numba: compiling \S*_fresh_kernel \.\.\.", err), err
    assert re.search(r"kernels\.compile_log: numba: compiled \S*_fresh_kernel in [0-9.]+ s", err), err
    # the run's stage handlers leave with it: later lines of this process do not go to this test's stderr
    assert not any(getattr(h, "_gnnserve_stage", False) for h in logging.getLogger("kernels.compile_log").handlers)
