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


def test_the_cli_lists_and_refuses_bad_jobs(tmp_path):
    env = _env(tmp_path / "numba")
    listed = subprocess.run([sys.executable, "-m", "serve.cli", "precompile", "--list"], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    lines = listed.stdout.splitlines()
    assert len(lines) == len(read(SHIPPED)) and all(ln.startswith("missing") for ln in lines), lines[:3]
    bad = subprocess.run([sys.executable, "-m", "serve.cli", "precompile", "--jobs", "0"], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--jobs must be >= 1" in bad.stderr


_SAVE = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from kernels.precompile import lock_cache_writes
    if sys.argv[3] == "lock":
        assert lock_cache_writes()
    import numba, numpy as np
    import twin
    start = float(sys.argv[2])
    while time.time() < start:  # both processes save at about the same moment
        pass
    for t in sys.argv[4].split(","):
        twin.f.compile((getattr(numba.types, t),))
""")

_LOAD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import twin
    got = {}
    for name, v in (("int64", np.int64(3)), ("float64", np.float64(3.5)), ("int32", np.int32(4)),
                    ("float32", np.float32(1.25)), ("int16", np.int16(5)), ("uint8", np.uint8(6))):
        got[name] = [bool(twin.f(v) == v * 2 + 1), type(twin.f(v)).__name__]
    print(json.dumps({"got": got, "hits": sum(twin.f.stats.cache_hits.values()),
                      "misses": sum(twin.f.stats.cache_misses.values())}))
""")


def test_two_processes_saving_signatures_of_one_function_each_keep_their_own(tmp_path):
    # numba picks a free data file name from the index it read: without the lock, two processes saving at once
    # could both take the same name, and the index then names one signature's code for the other
    (tmp_path / "twin.py").write_text("import numba\n\n@numba.njit(cache=True)\ndef f(x):\n    return x * 2 + 1\n")
    env = dict(_env(tmp_path / "numba"), PYTHONPATH=str(REPO_ROOT))
    import time

    for round_ in range(3):
        for p in (tmp_path / "numba").rglob("*"):
            if p.is_file():
                p.unlink()
        start = time.time() + 6.0
        procs = [subprocess.Popen([sys.executable, "-c", _SAVE, str(tmp_path), str(start), "lock", types],
                                  env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
                 for types in ("int64,float64,int32", "float32,int16,uint8")]
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-2000:]
        out = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path)], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        res = json.loads(out.stdout.strip().splitlines()[-1])
        assert all(ok for ok, _ in res["got"].values()), (round_, res)
        assert res["hits"] == 6 and res["misses"] == 0, (round_, res)  # all six from the cache, each its own code


def test_a_cold_start_compiles_in_parallel_and_then_nothing_itself(tiny_repo, tmp_path):
    from .serving import ServerProcess

    cache = tmp_path / "numba"
    srv = ServerProcess(tiny_repo, "--poll-s", "0", "--read-only", "--precompile-jobs", "2",
                        env={"NUMBA_CACHE_DIR": str(cache)}).start(timeout=900)
    try:
        log = srv.log()
    finally:
        assert srv.terminate() == 0
    said = [ln for ln in log.splitlines() if "precompiled" in ln and "kernel signatures" in ln]
    assert said, log[-4000:]
    assert "failed" not in said[0], said
    compiled = [ln for ln in log.splitlines() if "numba: compiled" in ln]
    assert compiled == [], compiled  # the server's own warm-up loaded every kernel from the cache
    assert list(cache.rglob("*.nbi")), "nothing in the cache"
