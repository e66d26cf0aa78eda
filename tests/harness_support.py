"""Building the host emulations of the CUDA kernels (tests/*_host_harness.cpp): each compiles its kernel's
own thread code as plain C++ and runs every GPU thread as a coroutine (tests/host_harness.h)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest


def build_host_harness(tmp_path_factory, source: Path, defines: dict[str, Path], name: str,
                       flags: tuple[str, ...] = ()) -> Path:
    """Compile ``source`` with ``-DKEY="path"`` for each of ``defines`` (the kernel file it includes) and
    ``flags`` into an executable; skip the test where no C++ compiler exists."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler for the host emulation")
    exe = tmp_path_factory.mktemp(name) / name
    cmd = [cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Wno-unknown-pragmas", "-Werror", "-x", "c++",
           *flags, *(f'-D{key}="{path}"' for key, path in defines.items()), str(source), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return exe


def compile_cubin(tmp_path: Path, source: Path, kernel: str) -> str:
    """Compile the CUDA file ``source`` with nvcc for sm_90 (ptxas verbose) and check what a build on this
    machine can: no error, the kernel ``kernel`` in the cubin, no register spills. Returns ptxas's report."""
    cubin = tmp_path / f"{source.stem}.cubin"
    cmd = ["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(cubin), str(source)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "error" not in res.stderr.lower(), res.stderr
    assert kernel.encode() in cubin.read_bytes()
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert spills and all(int(b) == 0 for b in spills), res.stderr
    return res.stderr
