"""The server's event loop (serve.loops, ``gnnserve serve --event-loop``): uvloop by default where it is
installed, the standard asyncio loop on request or where uvloop cannot be imported; the same answers on
both, over a real gRPC server on loopback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from serve.loops import EVENT_LOOPS, loop_name, new_event_loop, resolve_event_loop, run

from .serving import REPO_ROOT, ServerProcess, ServerThread

pytestmark = pytest.mark.timeout(300)


def test_resolve_with_uvloop_installed():
    pytest.importorskip("uvloop")  # a project dependency wherever wheels exist (pyproject.toml)
    assert resolve_event_loop("auto") == "uvloop"
    assert resolve_event_loop("uvloop") == "uvloop"
    assert resolve_event_loop("asyncio") == "asyncio"
    with pytest.raises(ValueError, match="unknown event loop 'trio'"):
        resolve_event_loop("trio")
    for kind, name in (("uvloop", "uvloop"), ("asyncio", "asyncio")):
        loop = new_event_loop(kind)
        try:
            assert loop_name(loop) == name
        finally:
            loop.close()


async def _running_loop() -> str:
    import asyncio

    return loop_name(asyncio.get_running_loop())


def test_run_uses_the_loop_asked_for():
    pytest.importorskip("uvloop")
    assert run(_running_loop(), "auto") == "uvloop"
    assert run(_running_loop(), "asyncio") == "asyncio"


def _blocked_uvloop(tmp_path):
    """A directory that, first on ``PYTHONPATH``, makes ``import uvloop`` fail as on a machine without it."""
    d = tmp_path / "no-uvloop"
    d.mkdir()
    (d / "uvloop.py").write_text("raise ImportError('No module named uvloop (blocked by the test)')\n")
    return d


def test_without_uvloop_auto_falls_back_and_uvloop_fails_clearly(tmp_path):
    code = textwrap.dedent("""
        from serve.loops import resolve_event_loop, run, loop_name
        import asyncio
        async def name():
            return loop_name(asyncio.get_running_loop())
        print(resolve_event_loop("auto"), run(name(), "auto"))
        try:
            resolve_event_loop("uvloop")
        except ValueError as exc:
            print("ERR", exc)
    """)
    env = {"PYTHONPATH": f"{_blocked_uvloop(tmp_path)}:{REPO_ROOT}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "asyncio asyncio"
    assert lines[1].startswith("ERR event loop 'uvloop' asked for but it cannot be imported")
    assert "--event-loop asyncio" in lines[1]


def test_cli_refuses_uvloop_it_cannot_import(tmp_path, tiny_repo):
    env = {"PYTHONPATH": f"{_blocked_uvloop(tmp_path)}:{REPO_ROOT}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "serve.cli", "serve", "--repo", str(tiny_repo), "--port", "0",
                          "--event-loop", "uvloop"], env=env, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert out.returncode == 2
    assert "gnnserve serve: event loop 'uvloop' asked for but it cannot be imported" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "serve.cli", "serve", "--repo", str(tiny_repo), "--event-loop", "trio"],
                         capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert bad.returncode == 2 and "invalid choice: 'trio'" in bad.stderr
    assert all(k in bad.stderr for k in EVENT_LOOPS)  # the choices are listed


def _answers(address: str, model: str) -> tuple[np.ndarray, np.ndarray]:
    from clients import GnnClient

    with GnnClient(address, timeout=60) as client:
        res = client.predict(model, list(range(20)), sampling_width=4)
        return res.labels, res.probabilities


@pytest.mark.parametrize("model", ["gcn", "shadow"])
def test_background_server_answers_alike_on_both_loops(tiny_repo, model):
    pytest.importorskip("uvloop")
    answers = {}
    for kind in ("uvloop", "asyncio"):
        with ServerThread(tiny_repo, {"event_loop": kind, "poll_s": 0}) as srv:
            assert loop_name(srv._loop) == kind
            answers[kind] = _answers(srv.address, model)
    np.testing.assert_array_equal(answers["uvloop"][0], answers["asyncio"][0])
    np.testing.assert_array_equal(answers["uvloop"][1], answers["asyncio"][1])


def test_background_server_rejects_an_unknown_loop(tiny_repo):
    with pytest.raises(ValueError, match="unknown event loop"):
        ServerThread(tiny_repo, {"event_loop": "trio"}).start()


@pytest.mark.parametrize("kind", ["auto", "asyncio"])
def test_cli_serves_and_drains_on_each_loop(tiny_repo, kind):
    """The CLI server on each loop: answers, logs its loop, and stops cleanly on SIGTERM (its signal
    handlers are the loop's)."""
    uv = pytest.importorskip("uvloop") if kind == "auto" else None
    with ServerProcess(tiny_repo, "--poll-s", "0", "--event-loop", kind) as proc:  # killed on the way out
        labels, probs = _answers(proc.address, "gcn")
        assert labels.shape == (20,) and np.allclose(probs.sum(axis=1), 1, atol=1e-5)
        assert f"{'uvloop' if uv else 'asyncio'} event loop" in proc.log()
        rc = proc.terminate()
        assert rc == 0, proc.log()
