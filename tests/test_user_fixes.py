"""User-reported defects of the ``gnnserve`` command and the server, each against the real components.

* ``gnnserve demo`` on bad input (a missing ``--dataset``, ``--nodes 5``, ``--epochs 0``): one line on
  stderr and exit 2, not a traceback;
* ``gnnserve train --device cuda`` without CUDA, ``--device foo``: one line naming the devices there are;
* ``gnnserve precompile --repo`` of a path that is not a directory: an error, not "compiled";
* ``--server http://HOST:PORT``: the message names the URL scheme, not IPv6 brackets, in every command
  that takes ``--server``;
* ``authorization: bearer <token>`` (any case of the scheme, several spaces or tabs) is accepted by a real
  server on loopback; a bare token or another scheme is not;
* the README and ``gnnserve log show --help`` name the server flags that put the update log in Redis.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from clients import GnnClient, cli
from clients._gen import gnnserve_pb2 as pb
from clients._gen import gnnserve_pb2_grpc as pbg
from serve.cli import main as gnnserve

from .serving import REPO_ROOT, ServerThread, free_port, no_traceback


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    no_traceback(err)
    return lines[0]


# --------------------------------------------------------------------------- 1. gnnserve demo
@pytest.mark.parametrize("args,msg", [
    (["--nodes", "5"], "gnnserve demo: --nodes must be >= 200, got 5"),
    (["--nodes", "150", "--epochs", "0"], "gnnserve demo: --nodes must be >= 200, got 150"),
    (["--epochs", "0"], "gnnserve demo: --epochs must be >= 1, got 0"),
    (["--epochs", "-3"], "gnnserve demo: --epochs must be >= 1, got -3"),
    (["--queries", "0"], "gnnserve demo: --queries must be >= 1, got 0"),
    (["--seed", "-1"], "gnnserve demo: --seed must be >= 0, got -1"),
    (["--dataset", "synthetic:5"], "gnnserve demo: cannot load --dataset 'synthetic:5': num_nodes=5 is too small"),
    (["--dataset", "synthetic:abc"], "gnnserve demo: cannot load --dataset 'synthetic:abc'"),
])
def test_demo_bad_arguments_are_one_line_exit_2(args, msg, capsys):
    rc = gnnserve(["demo", *args])
    captured = capsys.readouterr()
    assert rc == 2 and _one_line(captured.err).startswith(msg), captured.err
    assert captured.out == ""  # nothing ran


def test_demo_unloadable_dataset_is_one_line_exit_2(tmp_path, capsys):
    missing = tmp_path / "nonexistent.npz"
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip archive")
    for path, why in ((missing, "does not exist"), (junk, "not a readable .npz archive"), (tmp_path, "not a saved")):
        rc = gnnserve(["demo", "--dataset", str(path)])
        line = _one_line(capsys.readouterr().err)
        assert rc == 2 and line.startswith(f"gnnserve demo: cannot load --dataset {str(path)!r}: ") and why in line, line
        assert "pickled" not in line  # np.load's word for any file that is not an array (a new-user audit)


def test_demo_dataset_without_test_nodes_is_refused_before_training(tmp_path, capsys):
    from kernels.datasets import save_npz, synthetic_sbm

    ds = synthetic_sbm(60, num_classes=3, avg_degree=6, num_features=8, seed=1, name="small")
    assert len(ds.split("test")) == 0  # 20 training nodes per class take every node the validation leaves
    path = tmp_path / "small.npz"
    save_npz(ds, path)
    rc = gnnserve(["demo", "--dataset", str(path)])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and line.startswith(f"gnnserve demo: --dataset {str(path)!r}: it has no ") and "test" in line, line


def test_demo_in_a_subprocess_exits_2_without_a_traceback(tmp_path):
    """As a user runs it (the reported case): exit 2 and one line, not exit 1 and a traceback."""
    for args in (["--dataset", str(tmp_path / "nonexistent.npz")], ["--nodes", "5"], ["--epochs", "0"]):
        proc = subprocess.run([sys.executable, "-m", "serve.cli", "demo", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert _one_line(proc.stderr).startswith("gnnserve demo: "), proc.stderr


def test_train_on_a_dataset_without_a_split_is_one_line(tmp_path, capsys):
    """A new-user audit: `gnnserve train --dataset synthetic:50` trained with val=nan and ended in an
    AssertionError traceback (no validation nodes to choose the checkpoint by); synthetic:100 (no test nodes) in
    "Out of range float values are not JSON compliant". Now exit 2 and a last line naming the empty split."""
    for n, part in ((50, "validation"), (100, "test")):
        out = tmp_path / f"ck{n}"
        rc = gnnserve(["train", "--dataset", f"synthetic:{n}", "--model", "gcn", "--epochs", "2", "--out", str(out),
                       "--no-progress"])
        err = capsys.readouterr().err
        no_traceback(err)  # the stage log lines before it, then one line
        line = err.strip().splitlines()[-1]
        assert rc == 2 and line.startswith("error: dataset ") and f"has no {part} nodes" in line, line
        assert not out.exists()


# --------------------------------------------------------------------------- 2. gnnserve train --device
def _train_device(device: str, out: Path) -> list[str]:
    return ["train", "--dataset", "synthetic:300", "--model", "gcn", "--out", str(out), "--device", device,
            "--no-progress"]


def test_train_unusable_device_is_one_line_naming_the_available_ones(tmp_path, capsys):
    import torch

    available = "cpu" + "".join(f", cuda:{i}" for i in range(torch.cuda.device_count()))
    cases = [("foo", f"gnnserve train: --device 'foo' is not a device to train on: cpu, cuda or cuda:N "
                     f"(available: {available})"),
             ("meta", "gnnserve train: --device 'meta' is not a device to train on"),
             ("cuda:99", "gnnserve train: --device cuda:99 but ")]
    if not torch.cuda.is_available():  # serve's wording: "--device cuda but no CUDA device is available"
        cases.append(("cuda", "gnnserve train: --device cuda but no CUDA device is available (available: cpu)"))
    for device, msg in cases:
        out = tmp_path / "ck"
        rc = gnnserve(_train_device(device, out))
        line = _one_line(capsys.readouterr().err)
        assert rc == 2 and line.startswith(msg), (device, line)
        assert not out.exists()  # refused before anything was loaded or trained


# --------------------------------------------------------------------------- 3. gnnserve precompile --repo
def test_precompile_repo_that_is_not_a_directory_is_an_error(tmp_path, capsys):
    from kernels import precompile

    a_file = tmp_path / "file"
    a_file.write_text("x")
    for repo, why in ((tmp_path / "nonexistent", "does not exist"), (a_file, "is not a directory")):
        for extra in (["--list"], ["--jobs", "1"]):  # --list first: before the fix --jobs 1 compiled
            rc = precompile.main(["--repo", str(repo), *extra])
            captured = capsys.readouterr()
            line = _one_line(captured.err)
            assert rc == 2 and line.startswith(f"gnnserve precompile: model repository {str(repo)!r} {why} "), line
            assert captured.out == ""


# --------------------------------------------------------------------------- 4. --server with a URL scheme
SCHEME_MSG = "gRPC addresses are HOST:PORT without a scheme (e.g. localhost:8500)"


@pytest.mark.parametrize("given,scheme", [
    ("http://localhost:8500", "http://"),
    ("https://example.org", "https://"),
    ("http://[::1]:8500", "http://"),
    ("HTTP://localhost:8500", "HTTP://"),
    ("grpc://http://localhost:8500", "http://"),
])
def test_server_address_with_a_url_scheme_says_so(given, scheme, tmp_path, capsys):
    with pytest.raises(ValueError, match=re.escape(SCHEME_MSG)) as exc:
        cli.server_address(given)
    assert f"drop {scheme!r}" in str(exc.value) and "IPv6" not in str(exc.value)
    with pytest.raises(ValueError, match=re.escape(SCHEME_MSG)):  # the SDK takes addresses by the same rule
        GnnClient(given)
    dead = f"127.0.0.1:{free_port()}"
    updates = tmp_path / "up.jsonl"
    updates.write_text('{"add_edges": [[1, 2]]}\n')
    # every command with --server: one parser
    for cmd, extra in (("models", []), ("predict", ["--model", "m", "--nodes", "1"]),
                       ("update", ["--model", "m", str(updates)]), ("bench", ["--model", "m", "--queries", "2"])):
        rc = gnnserve([cmd, "--server", given, *extra])
        line = _one_line(capsys.readouterr().err)
        assert rc == 2 and line.startswith(f"gnnserve {cmd}: ") and SCHEME_MSG in line, (cmd, line)
    assert cli.server_address(dead) == dead  # a HOST:PORT still passes, and the gRPC schemes are kept
    assert cli.server_address("grpcs://example.org") == "grpcs://example.org:8500"
    assert cli.server_address("dns:///example.org:9000") == "dns:///example.org:9000"


# --------------------------------------------------------------------------- 5. the bearer token
TOKEN = "tok-Qm8-unguessable-4Zp"


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    """A real server on loopback over an empty repository, requiring TOKEN."""
    repo = tmp_path_factory.mktemp("empty-repo")
    srv = ServerThread(repo, {"poll_s": 0, "token": TOKEN}).start()
    yield srv
    srv.stop()


def _list_models(address: str, authorization: str | None) -> grpc.StatusCode:
    metadata = () if authorization is None else (("authorization", authorization),)
    with grpc.insecure_channel(address) as ch:
        try:
            pbg.GnnServiceStub(ch).ListModels(pb.ListModelsRequest(), metadata=metadata, timeout=60)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("authorization", [
    f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"bEaReR {TOKEN}", f"Bearer  {TOKEN}",
    f"bearer   {TOKEN}",
])  # tabs too (test_bearer_token_parsing), but gRPC's client refuses to send a tab in a header value
def test_bearer_scheme_in_any_case_and_spacing_is_accepted(token_server, authorization):
    assert _list_models(token_server.address, authorization) == grpc.StatusCode.OK


@pytest.mark.parametrize("authorization", [
    None, TOKEN, f" {TOKEN}", f"Bearer{TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN.upper()}",
    f"Bearer {TOKEN} {TOKEN}", f"Basic {TOKEN}", f"Token {TOKEN}", f"Bearers {TOKEN}", f"xBearer {TOKEN}",
    "Bearer ", "Bearer", "",
])
def test_a_bare_or_wrong_token_or_another_scheme_is_refused(token_server, authorization):
    assert _list_models(token_server.address, authorization) == grpc.StatusCode.UNAUTHENTICATED


def test_the_sdk_token_still_works(token_server):
    with GnnClient(token_server.address, token=TOKEN, timeout=60) as c:
        assert c.list_models() == []


def test_bearer_token_parsing():
    from serve.interceptors import bearer_token

    assert bearer_token("Bearer abc") == bearer_token(b"bearer \t abc") == b"abc"
    assert bearer_token("Bearer a b") == b"a b"  # the rest as sent: compared exactly
    for value in ("abc", "Bearer", "Bearer ", "Bearer\t", "Bearerabc", "Basic abc", " Bearer abc"):
        assert bearer_token(value) is None, value


# --------------------------------------------------------------------------- 6. where the update log lives
def test_log_help_and_readme_name_the_server_flags_that_put_the_log_in_redis(capsys):
    with pytest.raises(SystemExit):
        gnnserve(["serve", "--help"])
    serve_help = capsys.readouterr().out
    assert "--redis-url" not in serve_help and "--graph GRAPH" in serve_help and "--features FEATURES" in serve_help
    with pytest.raises(SystemExit):
        gnnserve(["log", "show", "--help"])
    log_help = " ".join(capsys.readouterr().out.split())
    assert "--redis-url REDIS_URL" in log_help  # the log command's own flag
    assert "servers' --redis-url" not in log_help
    assert "the Redis of the servers' --graph URL (else of their Redis --features URL)" in log_help, log_help
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert "with `--redis-url`" not in readme
    assert ("Servers with the graph or the features in Redis keep their logs in Redis, in the `--graph URL` one "
            "(else the Redis of `--features URL`): `gnnserve log show --redis-url URL`") in readme


def test_bench_server_takes_the_token_and_tls_options(token_server, tmp_path, capsys, monkeypatch):
    """``gnnserve bench --server`` had no credentials: a server with a token answered UNAUTHENTICATED. It takes
    the connection options of the other client commands now (and $GNNSERVE_TOKEN)."""
    from serve.bench import main as bench_main

    monkeypatch.delenv("GNNSERVE_TOKEN", raising=False)
    args = ["--server", token_server.address, "--model", "nothere", "--queries", "1"]
    assert bench_main(args) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    tok = tmp_path / "tok"
    tok.write_text(TOKEN + "\n")
    assert bench_main([*args, "--token-file", str(tok)]) == 1  # past the token: the model is not there
    err = capsys.readouterr().err
    assert "NOT_FOUND" in err and "nothere" in err, err
    monkeypatch.setenv("GNNSERVE_TOKEN", TOKEN)
    assert bench_main(args) == 1 and "NOT_FOUND" in capsys.readouterr().err
    assert bench_main([*args, "--cert", str(tok)]) == 2  # --cert without --key: a usage error
    assert "--cert and --key go together" in capsys.readouterr().err


def test_models_says_why_nothing_is_loaded(tmp_path, tiny_repo, capsys):
    """A QA report: with the only model refused at load, `gnnserve models` printed "no models loaded" and
    nothing else. It lists the repository's versions that are not served, with the reason."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo / "_data", repo / "_data")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "config.json").write_text("{not json")
    with ServerThread(repo) as srv:
        assert cli.models_main(["--server", srv.address]) == 0
        out = capsys.readouterr().out
        assert f"no models loaded on {srv.address}" in out
        assert re.search(r"broken v1: UNAVAILABLE, .*CheckpointError: config.json: not valid JSON", out), out
        with GnnClient(srv.address) as c:
            assert [(m["name"], m["state"]) for m in c.repository_index()] == [("broken", "UNAVAILABLE")]


def test_serve_no_progress_turns_the_bars_off(monkeypatch, tmp_path):
    """`gnnserve serve --no-progress` (a QA report: bars written to a server log are one long line): it sets
    tqdm's TQDM_DISABLE, which every bar of the process (and of --processes children) then honours."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert gnnserve(["serve", "--repo", str(tmp_path / "missing"), "--no-progress"]) == 2
    import os

    assert os.environ.get("TQDM_DISABLE") == "1"
    code = "from tqdm.auto import tqdm\nfor _ in tqdm(range(3), desc='bar'): pass\n"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "bar" not in shown.stderr, shown.stderr  # the environment the test set: inherited, no bar
    monkeypatch.delenv("TQDM_DISABLE")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"})
    assert "bar" in shown.stderr


def test_bench_names_the_graph_version_it_measured_on(tiny_repo, tmp_path, capsys):
    """A QA report: `gnnserve bench` measured accuracy on a live-updated graph without saying so. Its rows
    carry the graph version (--json), and the table says when it is not the dataset's own graph."""
    import json
    import shutil

    import numpy as np

    from serve.bench import main as bench_main

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo / "gcn", repo / "gcn")
    shutil.copytree(tiny_repo / "_data", repo / "_data")
    with ServerThread(repo) as srv:
        args = ["--server", srv.address, "--model", "gcn", "--queries", "2", "--widths", "0"]
        assert bench_main(args) == 0
        assert "measured on graph version" not in capsys.readouterr().out  # the dataset's graph: nothing to say
        with GnnClient(srv.address) as c:
            c.update_graph("gcn", features={1: np.zeros(c.get_model("gcn").num_features)})
        assert bench_main(args) == 0
        assert "measured on graph version 1 " in capsys.readouterr().out
        assert bench_main([*args, "--json"]) == 0
        assert {r["graph_version"] for r in json.loads(capsys.readouterr().out)} == {1}
