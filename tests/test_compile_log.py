"""kernels.compile_log: numba's compilations said as they happen (a first start on a machine compiles the CPU
kernels for a minute or more), the outermost one of a thread only, nothing when nothing compiles."""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path

import numba
import numpy as np
import pytest

from kernels import compile_log


def _mine(caplog) -> list[str]:
    """This thread's messages (a loader thread left by an earlier test may compile meanwhile)."""
    me = threading.current_thread().name
    return [r.getMessage() for r in caplog.records if r.threadName == me]


def test_a_compilation_is_logged_once_with_its_callees_inside_it(caplog):
    assert compile_log.install() and compile_log.install()  # once per process, however often asked

    @numba.njit(cache=False)
    def _callee(a):
        return a * 2.0

    @numba.njit(cache=False)
    def _outer(a):
        return _callee(a).sum()

    before, _ = compile_log.compiled()
    with caplog.at_level(logging.INFO, logger="kernels.compile_log"):
        assert _outer(np.arange(4.0)) == 12.0
    done = [m for m in _mine(caplog) if "numba: compiled" in m]
    assert len(done) == 1 and "test_compile_log" in done[0] and "_outer" in done[0], done  # not _callee
    assert any("numba: compiling" in m and "_outer" in m for m in _mine(caplog))
    count, seconds = compile_log.compiled()
    assert count >= before + 1 and seconds > 0
    # benchmarks/first_start.py reads the server's log with this pattern (loaded by path: benchmarks/ on
    # sys.path would shadow the serve package with benchmarks/serve.py)
    spec = importlib.util.spec_from_file_location(
        "first_start", Path(__file__).resolve().parent.parent / "benchmarks" / "first_start.py")
    first_start = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(first_start)

    m = first_start.COMPILED.search(done[0])
    assert m is not None and m.group(1).endswith("_outer") and float(m.group(2)) >= 0

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kernels.compile_log"):
        assert _outer(np.arange(5.0)) == 20.0  # the same signature: nothing compiles
    assert not _mine(caplog)


def test_a_failed_compilation_is_said_and_not_counted(caplog):
    compile_log.install()

    @numba.njit(cache=False)
    def _untypable(a):
        return a + "text"  # no such addition: numba's typing fails

    with caplog.at_level(logging.INFO, logger="kernels.compile_log"):
        with pytest.raises(numba.core.errors.TypingError):
            _untypable(np.arange(3.0))
    said = _mine(caplog)
    assert any("_untypable" in m and "failed after" in m for m in said), said
    assert not any("numba: compiled" in m and "_untypable" in m for m in said), said

    @numba.njit(cache=False)
    def _fine(a):
        return a.sum()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kernels.compile_log"):
        assert _fine(np.ones(3)) == 3.0  # the thread still logs after a failure
    assert any("numba: compiled" in m and "_fine" in m for m in _mine(caplog))


def test_a_server_installs_the_log_before_its_models_load(tiny_repo, monkeypatch):
    from serve import registry

    from .serving import ServerThread

    order = []
    real_install, real_load = compile_log.install, registry.ModelRegistry._load_version
    monkeypatch.setattr(compile_log, "install", lambda: order.append("install") or real_install())

    def load(self, *args, **kwargs):  # each model version's load and warm-up (its kernels compile there)
        order.append("load")
        return real_load(self, *args, **kwargs)

    monkeypatch.setattr(registry.ModelRegistry, "_load_version", load)
    with ServerThread(tiny_repo, {"runtime_kw": {}}):
        pass
    assert order[0] == "install" and "load" in order, order
