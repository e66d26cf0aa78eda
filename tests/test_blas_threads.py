"""The BLAS pools' thread count a server sets (kernels.threads, ``gnnserve serve --blas-threads``), on the
real libraries NumPy and SciPy load (SciPy's OpenBLAS is the one numba's ``np.dot`` calls)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numba
import numpy as np
import pytest

from kernels.threads import (
    SERVER_BLAS_THREADS,
    blas_pools,
    per_thread_pools,
    server_blas_threads,
    set_blas_threads,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def restore_pools(monkeypatch):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)  # the default rule leaves the pools alone with it
    before = max(p.threads for p in blas_pools())
    yield
    set_blas_threads(before)


def test_the_rule_configured_then_the_environment_then_one():
    assert SERVER_BLAS_THREADS == 1
    assert server_blas_threads(None, {}) == 1
    assert server_blas_threads(None, {"OMP_NUM_THREADS": "8"}) == 1  # --processes sets it for torch and numba
    assert server_blas_threads(None, {"OPENBLAS_NUM_THREADS": "4"}) is None  # someone chose the pools' count
    assert server_blas_threads(3, {"OPENBLAS_NUM_THREADS": "4"}) == 3
    assert server_blas_threads(0, {}) is None
    with pytest.raises(ValueError, match=">= 0"):
        server_blas_threads(-1, {})
    with pytest.raises(ValueError, match=">= 1"):
        set_blas_threads(0)


def test_the_pools_include_the_one_numbas_dot_calls_and_follow_the_setting(restore_pools):
    @numba.njit
    def dot(a, b):
        return np.dot(a, b)

    a = np.random.default_rng(0).standard_normal((300, 64)).astype(np.float32)
    want = a @ a.T
    pools = blas_pools()
    assert any("scipy" in Path(p.path).parent.name and p.internal_api == "openblas" for p in pools), pools
    for n in (1, 2):
        after = set_blas_threads(n)
        assert after and all(p.threads == n for p in after), after
        np.testing.assert_allclose(dot(a, np.ascontiguousarray(a.T)), want, rtol=1e-4, atol=1e-3)


def test_any_thread_sets_them_for_the_process(restore_pools):
    # threadpoolctl alone ignores a thread other than the first one that set a pthreads OpenBLAS's count
    set_blas_threads(3)
    worker = threading.Thread(target=set_blas_threads, args=(1,))
    worker.start()
    worker.join()
    assert all(p.threads == 1 for p in blas_pools()), blas_pools()
    set_blas_threads(2)
    assert all(p.threads == 2 for p in blas_pools()), blas_pools()


def test_concurrent_settings_leave_every_pool_on_one_of_them(restore_pools):
    workers = [threading.Thread(target=lambda n=n: [set_blas_threads(n) for _ in range(20)]) for n in (1, 2, 3, 1)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    counts = {p.threads for p in blas_pools()}
    assert len(counts) == 1 and counts <= {1, 2, 3}, blas_pools()
    assert per_thread_pools() == []  # the PyPI wheels' OpenBLAS is built on pthreads: one count per library


@pytest.mark.parametrize("configured, expected", [(None, 1), (2, 2)])
def test_a_server_sets_the_pools_when_it_is_built(tiny_repo, restore_pools, configured, expected):
    from .serving import ServerThread

    set_blas_threads(3)
    srv = ServerThread(tiny_repo, {"blas_threads": configured}).start()
    try:
        assert all(p.threads == expected for p in blas_pools()), blas_pools()
    finally:
        srv.stop()


def test_a_server_leaves_the_pools_at_zero(tiny_repo, restore_pools):
    from .serving import ServerThread

    set_blas_threads(3)
    srv = ServerThread(tiny_repo, {"blas_threads": 0}).start()
    try:
        assert all(p.threads == 3 for p in blas_pools()), blas_pools()
    finally:
        srv.stop()


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    return subprocess.run([sys.executable, "-m", "serve.cli", "serve", *args], cwd=REPO_ROOT, env=full,
                          capture_output=True, text=True, timeout=300)


def test_cli_refuses_a_negative_count(tiny_repo):
    out = _serve("--repo", str(tiny_repo), "--port", "0", "--blas-threads", "-1")
    assert out.returncode == 2
    assert "gnnserve serve: --blas-threads must be >= 0" in out.stderr


def test_cli_server_says_its_pools_in_the_log(tiny_repo):
    from .serving import ServerProcess

    srv = ServerProcess(tiny_repo, "--poll-s", "0", "--blas-threads", "2").start()
    try:
        log = srv.log()
    finally:
        assert srv.terminate() == 0
    line = next((ln for ln in log.splitlines() if "BLAS pools on 2 thread(s)" in ln), None)
    assert line is not None, log
    assert "openblas" in line and " at 2" in line and " at 1" not in line, line


def test_a_server_without_threadpoolctl_warns_and_goes_on(monkeypatch, caplog, restore_pools):
    from serve import server

    set_blas_threads(2)
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # as where the package is not installed
    with caplog.at_level("WARNING", logger="serve.server"):
        server._set_blas_threads(None)
    assert any("could not set the BLAS pools to 1 thread(s)" in r.getMessage() for r in caplog.records), caplog.text
    monkeypatch.delitem(sys.modules, "threadpoolctl")
    assert all(p.threads == 2 for p in blas_pools())


def test_a_server_warns_when_no_pool_is_found(monkeypatch, caplog, restore_pools):
    # what threadpoolctl 3.1-3.4 gives on NumPy's and SciPy's wheels (it looks for libopenblas* files only)
    from kernels import threads
    from serve import server

    monkeypatch.setattr(threads, "_controllers", list)
    with caplog.at_level("INFO", logger="serve.server"):
        server._set_blas_threads(None)
    msgs = [r.getMessage() for r in caplog.records if r.name == "serve.server"]
    assert any("BLAS pools not all on 1 thread(s)" in m and "none found" in m for m in msgs), msgs
    assert not any(m.startswith("BLAS pools on ") for m in msgs), msgs


def test_a_server_scans_the_libraries_once_and_names_per_thread_pools(monkeypatch, caplog, restore_pools):
    # an OpenBLAS built on OpenMP (some distributions' packages) keeps its count per thread: the real pools,
    # seen through a proxy that says so, get the warning; the server looks at the loaded libraries once
    from kernels import threads
    from serve import server

    class OpenMPBuilt:
        def __init__(self, c):
            self._c = c
            self.threading_layer = "openmp"

        def __getattr__(self, name):
            return getattr(self._c, name)

    real, scans = threads._controllers, []

    def controllers():
        scans.append(1)
        return [OpenMPBuilt(c) for c in real()]

    monkeypatch.setattr(threads, "_controllers", controllers)
    set_blas_threads(2)
    scans.clear()
    with caplog.at_level("INFO", logger="serve.server"):
        server._set_blas_threads(None)
    assert len(scans) == 1
    pools = blas_pools()
    assert pools and all(p.per_thread and p.threads == 1 for p in pools), pools
    msgs = [r.getMessage() for r in caplog.records if r.name == "serve.server"]
    for p in pools:
        assert any("built on OpenMP" in m and p.path in m for m in msgs), msgs
