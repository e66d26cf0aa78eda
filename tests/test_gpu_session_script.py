"""benchmarks/gpu_session.sh, the script a session with a lent GPU runs step by step: it parses, every
step its header lists has a branch, docs/BENCHMARKS.md names the same steps, and a device step on a
machine without CUDA runs the GPU tests, which all skip (the dry run a CPU session can do)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_session.sh"


def _steps() -> tuple[list[str], list[str], dict[str, list[tuple[str, int]]]]:
    """(the usage line's steps, the steps with a ``step_`` function, each composite's parts and limits)."""
    text = SCRIPT.read_text()
    usage = re.search(r'usage: \$0 ([a-z|]+)"', text)
    assert usage is not None
    listed = usage.group(1).split("|")
    functions = re.findall(r"^step_([a-z]+)\(\) \{", text, re.M)
    singles = re.search(r"^([a-z|]+)\)\n\s+\"step_\$step\" 570$", text, re.M)
    assert singles is not None and sorted(singles.group(1).split("|")) == sorted(functions), functions
    composites = {}
    for name, body in re.findall(r"^([a-z]+)\)\n((?:\s+.*\n)+?)\s+;;", text, re.M):
        composites[name] = [(p, int(t)) for p, t in re.findall(r"\bpart ([a-z]+) (\d+)$", body, re.M)]
    return listed, functions, composites


def test_the_script_parses_and_every_step_has_a_branch():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    listed, functions, composites = _steps()
    assert listed[0] == "prepare" and sorted(listed[1:]) == sorted(functions + list(composites)), listed
    header = SCRIPT.read_text().split("set -euo pipefail")[0]
    for step in listed:
        assert f"gpu_session.sh {step}" in header, step
    doc = (REPO / "docs" / "BENCHMARKS.md").read_text()
    for step in functions + list(composites):
        assert f"`{step}`" in doc, step


def test_each_composite_fits_one_device_call():
    # one device call runs at most 600 s: a composite's parts must end inside it, with room for the
    # start (the wheels' install, the CUDA context), and every part must be a step that exists
    _, functions, composites = _steps()
    assert set(composites) == {"core", "scale", "more", "fused", "tuning", "verify", "ab", "shadow", "defaults", "next", "second"}, composites
    for name, parts in composites.items():
        assert parts and all(p in functions for p, _ in parts), (name, parts)
        assert sum(t for _, t in parts) <= 560, (name, parts)
    assert composites["core"][0][0] == "tests"  # correctness first


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_a_device_step_without_cuda_runs_and_skips_the_gpu_tests(tmp_path):
    # `python3` on the device is the interpreter with torch: here, the one running the tests
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ['PATH']}", OUT=str(tmp_path / "out"),
               GPU_SESSION_NO_WHEELS="1")  # .gpu/whl, if prepared here, holds the device's cp312 wheels
    res = subprocess.run(["bash", str(SCRIPT), "tests"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    log = (tmp_path / "out" / "tests.log").read_text()
    assert re.search(r"\d+ skipped", log) and " failed" not in log and " passed" not in log, log[-1500:]


def test_every_device_command_names_its_dataset():
    # on a lent machine the path a checkpoint recorded for its dataset (../shared/data here) does not
    # exist: every benchmark that serves .gpu/repo's checkpoints or loads a dataset must be handed
    # .gpu/data (a ceiling run without it failed here with every client erroring)
    text = SCRIPT.read_text().replace("\\\n", " ")
    commands = re.findall(r"python3 (benchmarks/\S+\.py[^|\n]*)", text)
    assert len(commands) >= 7, commands
    for cmd in commands:
        assert '--data "$data/' in cmd or '--data-dir "$data"' in cmd, cmd
