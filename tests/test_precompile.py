"""kernels.precompile: a cold numba cache's compilations in parallel processes before a server loads its models.

The end-to-end check starts a real server on an empty numba cache (as on a fresh machine): it must precompile
in child processes and then compile nothing itself. The rest: the shipped list reads back against this version
of the kernels, the recording of what a process compiled, the sharing out, the CLI, and the lock that keeps two
processes saving two signatures of one function from giving both the same data file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import pytest

from kernels import precompile
from kernels.precompile import SHIPPED, Entry, dispatcher, parse, read

REPO_ROOT = Path(__file__).resolve().parent.parent


def _env(cache: Path) -> dict[str, str]:
    return dict(os.environ, NUMBA_CACHE_DIR=str(cache),
                PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_every_shipped_signature_reads_back_against_these_kernels():
    entries = read(SHIPPED)
    modules = {e.module for e in entries}
    assert {"kernels.fused_forward", "kernels.plan", "kernels.spmm_cpu", "kernels.graph_edit",
            "kernels.ppr_push", "kernels.subgraph"} <= modules, modules
    for e in entries:
        disp = dispatcher(e)  # a renamed or removed kernel fails here: record the list again (module docstring)
        assert isinstance(disp, numba.core.dispatcher.Dispatcher), e
        assert repr(parse(e.signature)) == e.signature, e
        assert e.seconds > 0, e


def test_parse_reads_numba_types_and_nothing_else():
    assert repr(parse("(Array(float32, 2, 'C', True, aligned=True), int64, bool)")) == \
        "(Array(float32, 2, 'C', True, aligned=True), int64, bool)"
    for bad in ("(Literal[int](0),)", "__import__('os').getcwd()", "(int64", "int64", "(1, 2)"):
        with pytest.raises(ValueError):
            parse(bad)


def test_read_skips_what_it_cannot_use_and_keeps_the_last_time(tmp_path):
    f = tmp_path / "list.tsv"
    f.write_text("kernels.plan\t_walk_sums\t(int64,)\t1.5\n"
                 "garbage line\n"
                 "os\tsystem\t(int64,)\t1.0\n"  # not a kernel of this package
                 "kernels.plan\t_walk_sums\t(int64,)\t2.5\n"
                 "kernels.plan\t_walk_sums\t(int32,)\tnot-a-number\n")
    assert read(f) == [Entry("kernels.plan", "_walk_sums", "(int64,)", 2.5)]
    assert read(tmp_path / "absent.tsv") == []


def test_a_signature_of_another_arity_is_not_missing_but_skipped():
    """This machine's list keeps signatures an earlier version of a kernel was compiled with; one whose argument
    count the kernel no longer has can never compile (each start after the module changed warned "Signature
    mismatch: 22 argument types given, but function takes 27 arguments"): skipped like a removed kernel."""
    shipped = next(e for e in read(SHIPPED) if e.qualname == "_walk_sums")
    args = parse(shipped.signature)
    shorter = Entry(shipped.module, shipped.qualname, repr(tuple(args[:-1])), 1.0)
    longer = Entry(shipped.module, shipped.qualname, repr((*args, args[-1])), 1.0)
    assert precompile.missing([shorter, longer]) == []


def test_sharing_keeps_a_module_together_and_balances_the_rest():
    e = [Entry("kernels.fused_forward", "_inner", "(a,)", 20.0), Entry("kernels.fused_forward", "_outer", "(b,)", 2.0),
         Entry("kernels.spmm_cpu", "_kernel", "(c,)", 8.0), Entry("kernels.plan", "_build_plan", "(d,)", 5.0),
         Entry("kernels.ppr_push", "_ppr_batch", "(e,)", 5.0), Entry("kernels.graph_edit", "_splice", "(f,)", 1.0)]
    shares = precompile._share(e, 2)
    assert len(shares) == 2
    by_module = {x.module: i for i, share in enumerate(shares) for x in share}
    assert sorted(x.key for share in shares for x in share) == sorted(x.key for x in e)  # each once
    ff = [i for i, share in enumerate(shares) if any(x.module == "kernels.fused_forward" for x in share)]
    assert len(ff) == 1 and all(x.module == "kernels.fused_forward" for x in shares[ff[0]])  # 22 s alone
    assert by_module["kernels.spmm_cpu"] == by_module["kernels.plan"] != ff[0]
    assert precompile._share(e, 8) and len(precompile._share(e, 8)) == 5  # one per module at most
    assert len(precompile._share(e, 1)) == 1


_RECORD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from kernels import compile_log, precompile
    from kernels.subgraph import _grow

    compile_log.install()
    _grow(np.zeros(3, np.int64), 5)
    mine = [e for e in precompile.read(precompile.local_path()) if e.qualname == "_grow"]
    other = precompile.Entry("kernels.subgraph", "_grow", "(Array(int16, 1, 'C', False, aligned=True), int64)")
    print(json.dumps({"mine": [list(e.key) for e in mine],
                      "missing": [list(e.key) for e in precompile.missing(mine + [other])]}))
""")


def test_a_compiled_signature_is_recorded_and_then_known_as_cached(tmp_path):
    out = subprocess.run([sys.executable, "-c", _RECORD], env=_env(tmp_path / "numba"), cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    sig = "(Array(int64, 1, 'C', False, aligned=True), int64)"
    assert got["mine"] == [["kernels.subgraph", "_grow", sig]], got
    assert got["missing"] == [["kernels.subgraph", "_grow", "(Array(int16, 1, 'C', False, aligned=True), int64)"]]
    listed = list((tmp_path / "numba").rglob(precompile.LOCAL_NAME))
    assert len(listed) == 1, listed


def test_the_cli_lists_and_refuses_bad_jobs(tiny_repo, tmp_path):
    env = _env(tmp_path / "numba")
    listed = subprocess.run([sys.executable, "-m", "serve.cli", "precompile", "--list"], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    lines = listed.stdout.splitlines()
    assert len(lines) == len(read(SHIPPED)) and all(ln.startswith("missing") for ln in lines), lines[:3]
    # with a repository: the narrow kernel of its models' class count (the tiny models have 4 classes)
    with_repo = subprocess.run([sys.executable, "-m", "serve.cli", "precompile", "--list", "--repo", str(tiny_repo)],
                               env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert with_repo.returncode == 0, with_repo.stderr[-2000:]
    assert any("kernels.spmm_cpu.serial_kernel_f4 " in ln for ln in with_repo.stdout.splitlines()), with_repo.stdout
    bad = subprocess.run([sys.executable, "-m", "serve.cli", "precompile", "--jobs", "0"], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--jobs must be >= 1" in bad.stderr


_SAVE = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from numba.core.caching import IndexDataCacheFile
    from kernels.precompile import lock_cache_writes

    read_index = IndexDataCacheFile._load_index

    def slow_read(self):  # widen the window between reading the index and writing it (numba's race)
        got = read_index(self)
        time.sleep(0.5)
        return got

    IndexDataCacheFile._load_index = slow_read
    if sys.argv[2] == "lock":
        assert lock_cache_writes()
    import numba
    import twin
    open(os.path.join(sys.argv[1], "ready-" + sys.argv[3]), "w").close()
    while len([f for f in os.listdir(sys.argv[1]) if f.startswith("ready-")]) < 2:  # both at once
        time.sleep(0.001)
    for t in sys.argv[3].split(","):
        twin.f.compile((getattr(numba.types, t),))
""")

_LOAD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import twin
    got = {}
    for name in ("int64", "float64", "int32", "float32", "int16", "uint8"):
        disp = twin.f
        sig = (getattr(__import__("numba").types, name),)
        cres = disp._cache.load_overload(sig, disp.targetctx)  # what the cache gives for this signature
        got[name] = None if cres is None else str(cres.signature.args[0])
    print(json.dumps(got))
""")


def _save_twice_at_once(tmp_path: Path, mode: str) -> dict:
    for p in list(tmp_path.glob("ready-*")) + [p for p in (tmp_path / "numba").rglob("*") if p.is_file()]:
        p.unlink()
    env = dict(_env(tmp_path / "numba"), PYTHONPATH=str(REPO_ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", _SAVE, str(tmp_path), mode, types], env=env, cwd=tmp_path,
                              stderr=subprocess.PIPE, text=True)
             for types in ("int64,float64,int32", "float32,int16,uint8")]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    out = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_processes_saving_signatures_of_one_function_each_keep_their_own(tmp_path):
    # numba picks a free data file name from the index it read: two processes saving at once both take the
    # same name, one's index entries are lost and the index can name one signature's code for another
    (tmp_path / "twin.py").write_text("import numba\n\n@numba.njit(cache=True)\ndef f(x):\n    return x * 2 + 1\n")
    locked = _save_twice_at_once(tmp_path, "lock")
    assert locked == {t: t for t in ("int64", "float64", "int32", "float32", "int16", "uint8")}, locked
    # the control: the same two processes without the lock lose signatures or cross them
    unlocked = _save_twice_at_once(tmp_path, "nolock")
    assert unlocked != locked, unlocked


def test_a_cold_start_compiles_in_parallel_and_then_nothing_itself(tiny_repo, tmp_path):
    """... nor at its first requests: existing nodes at the exact and a sampled width, and new nodes (their
    pushes and balls on the repository's memory-mapped, read-only graph: kernels of their own signatures)."""
    import numpy as np

    from clients import GnnClient, NewNode

    from .serving import ServerProcess

    cache = tmp_path / "numba"
    srv = ServerProcess(tiny_repo, "--poll-s", "0", "--read-only", "--precompile-jobs", "2",
                        env={"NUMBA_CACHE_DIR": str(cache)}).start(timeout=900)
    try:
        with GnnClient(srv.address) as client:
            new = [NewNode(np.ones(16, np.float32), [1, 5, 9]), NewNode(np.zeros(16, np.float32), [2], [0.5])]
            for model in ("gcn", "shadow"):
                for width in (0, 3):
                    assert len(client.predict(model, [0, 3, 7], sampling_width=width).labels) == 3
                    assert len(client.predict(model, [4], sampling_width=width, new_nodes=new).labels) == 3
        log = srv.log()
    finally:
        assert srv.terminate() == 0
    said = [ln for ln in log.splitlines() if "precompiled" in ln and "kernel signatures" in ln]
    assert said, log[-4000:]
    assert "failed" not in said[0], said
    compiled = [ln for ln in log.splitlines() if "numba: compiled" in ln]
    assert compiled == [], compiled  # its warm-up and its first requests loaded every kernel from the cache
    assert list(cache.rglob("*.nbi")), "nothing in the cache"


def test_a_signal_while_precompiling_stops_the_server_and_its_compiling_processes(tiny_repo, tmp_path):
    import signal
    import time

    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "serve.cli", "serve", "--repo", str(tiny_repo), "--port", "0", "--poll-s", "0",
           "--read-only", "--precompile-jobs", "2"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=_env(tmp_path / "numba"))
        try:
            t_end = time.monotonic() + 120
            while b"before the models load" not in log.read_bytes():
                assert proc.poll() is None and time.monotonic() < t_end, log.read_text()
                time.sleep(0.1)
            time.sleep(1.0)
            children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                        text=True).stdout.split()]
            assert len(children) == 2, children
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(60)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert rc == 0, log.read_text()[-3000:]
    assert took < 5.0, f"took {took:.1f} s:\n{log.read_text()[-3000:]}"  # not the minute of compiling left
    assert "stopped while starting" in log.read_text()
    deadline = time.monotonic() + 10
    alive = children
    while alive and time.monotonic() < deadline:
        alive = [c for c in alive if Path(f"/proc/{c}").exists()
                 and "Z" not in Path(f"/proc/{c}/stat").read_text().split(")")[-1].split()[0]]
        time.sleep(0.1)
    assert alive == [], alive


def test_a_signature_numba_refused_is_skipped_until_its_module_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(precompile, "local_path", lambda: tmp_path / precompile.LOCAL_NAME)
    e = read(SHIPPED)[0]
    assert e.key in {x.key for x in precompile.known()}
    precompile._remember_failed([e])
    assert e.key not in {x.key for x in precompile.known()}
    failed = tmp_path / precompile.FAILED_NAME
    failed.write_text(failed.read_text().replace(f"\t{precompile._stamp(e.module)}\n", "\t12.00\n"))  # older source
    assert e.key in {x.key for x in precompile.known()}


def test_a_start_announces_the_compilation_before_it_runs(monkeypatch):
    """at_start's ``announce`` (the demo's console line) is called with the count, the recorded seconds and the
    processes before the compiling processes start, and not at all when the cache lacks nothing."""
    from kernels import precompile as pc

    todo = [pc.Entry("kernels.dense", "rows_matmul_into", "(int64,)", 4.0),
            pc.Entry("kernels.subgraph", "_induced_kernel", "(int64,)", 3.0)]
    events = []
    monkeypatch.setattr(pc, "lock_cache_writes", lambda: True)
    monkeypatch.setattr(pc, "missing", lambda entries: list(todo))
    monkeypatch.setattr(pc, "run", lambda entries, jobs: events.append(("run", len(entries), jobs))
                        or pc.Result(len(entries), [], 2, 0.1))
    res = pc.at_start(4, (), lambda n, s, p: events.append(("announce", n, s, p)))
    assert events == [("announce", 2, 7.0, 2), ("run", 2, 4)] and res.compiled == 2
    events.clear()
    monkeypatch.setattr(pc, "missing", lambda entries: [])
    assert pc.at_start(4, (), lambda *a: events.append(a)) is None and events == []


def test_a_copy_of_a_kernel_module_imported_from_elsewhere_is_not_recorded(tmp_path, monkeypatch):
    """benchmarks.at_revision imports an older commit's kernels as ``kernels._<name>_at_base`` from a work
    directory: what those compile must not enter this machine's list (a later start would try to import them, fail
    and log it); this package's own kernels are recorded."""
    import importlib.util
    import types as pytypes

    from numba.core import types

    monkeypatch.setattr(precompile, "local_path", lambda: tmp_path / precompile.LOCAL_NAME)
    src = tmp_path / "work" / "subgraph_at_base.py"
    src.parent.mkdir()
    src.write_text("def _grow(a, n):\n    return a\n")
    spec = importlib.util.spec_from_file_location("kernels._subgraph_at_base", src)
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "kernels._subgraph_at_base", copy)
    spec.loader.exec_module(copy)
    args = (types.Array(types.int64, 1, "C"), types.int64)
    precompile.note(pytypes.SimpleNamespace(__module__="kernels._subgraph_at_base", __qualname__="_grow"), args, 1.0)
    precompile.note(pytypes.SimpleNamespace(__module__="kernels.subgraph", __qualname__="_grow"), args, 1.0)
    assert [e.module for e in read(tmp_path / precompile.LOCAL_NAME)] == ["kernels.subgraph"]
