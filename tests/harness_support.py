"""What the tests of the CUDA kernels share without a GPU: building the host emulations
(tests/*_host_harness.cpp: each compiles its kernel's own thread code as plain C++ and runs every GPU thread
as a coroutine, tests/host_harness.h), the nvcc build check, an NVRTC compile as CuPy makes it (where a
libnvrtc is found), and reading a kernel's parameter list and argument struct from its source."""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

#: a harness under AddressSanitizer and UBSan, its shared memory and arrays of their exact sizes
#: (HARNESS_EXACT): a read or write past any end is caught
ASAN_FLAGS = ("-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
              "-DHARNESS_EXACT")


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


def run_harness(args: list, workdir: Path, errors: dict[int, str], order: str = "forward") -> np.ndarray:
    """Run a one-launch kernel's harness (``args``: the executable, ``workdir`` and its parameters) with its
    threads in ``order`` (``HARNESS_ORDER``) and return the float32 answers it wrote to ``workdir/out.bin``;
    a failing exit status fails the test with its meaning from ``errors``."""
    env = dict(os.environ, HARNESS_ORDER=order, ASAN_OPTIONS="detect_leaks=0")
    run = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, f"harness exit {run.returncode}: {errors.get(run.returncode, run.stderr)}"
    return np.fromfile(workdir / "out.bin", dtype=np.float32)


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


def kernel_params(source: Path, kernel: str) -> list[tuple[str, str]]:
    """The ``(kind, name)`` of each parameter of the ``extern "C"`` kernel ``kernel`` in ``source``: kind
    "ptr" for a pointer, "i32" for an int, as the launchers' ARG_KINDS name them."""
    text = _strip_comments(source.read_text())
    m = re.search(rf"{kernel}\s*\(([^)]*)\)\s*{{", text)
    assert m is not None, f"no kernel {kernel} in {source}"
    out = []
    for param in m.group(1).split(","):
        decl = param.strip()
        name = re.findall(r"\w+", decl)[-1]
        out.append(("ptr" if "*" in decl else "i32", name))
    return out


def struct_members(source: Path, struct: str) -> list[str]:
    """The member names of ``struct`` in ``source``, in order (several to a declaration allowed)."""
    text = _strip_comments(source.read_text())
    m = re.search(rf"struct {struct}\s*{{(.*?)}};", text, re.S)
    assert m is not None, f"no struct {struct} in {source}"
    names = []
    for decl in m.group(1).split(";"):
        if decl.strip():
            names += [re.findall(r"\w+", part)[-1] for part in decl.split(",")]
    return names


def nvrtc_library() -> str | None:
    """A libnvrtc to compile with (no GPU needed): ``GNNSERVE_NVRTC`` (its path), the system's, or the one of an
    ``nvidia-cuda-nvrtc`` wheel on ``sys.path``; None where there is none."""
    if os.environ.get("GNNSERVE_NVRTC"):
        return os.environ["GNNSERVE_NVRTC"]
    import ctypes.util

    found = ctypes.util.find_library("nvrtc")
    if found:
        return found
    for root in sys.path:
        hits = sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so.*")))
        hits = [h for h in hits if "builtins" not in h and ".alt." not in h]
        if hits:
            return hits[-1]
    return None


def compile_nvrtc(library: str, code: str, name: str, options: list[str]) -> str:
    """Compile ``code`` with NVRTC (``library``) as CuPy's RawModule does and return the PTX; the log on
    failure."""
    lib_dir = os.path.dirname(library)
    for builtins in glob.glob(os.path.join(lib_dir, "libnvrtc-builtins.so.*")):  # NVRTC opens it by name
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(library)
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), name.encode(), 0, None, None) == 0
    try:
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        rc = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        assert rc == 0, log.value.decode(errors="replace")
        assert "warning" not in log.value.decode(errors="replace").lower(), log.value.decode(errors="replace")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        assert lib.nvrtcGetPTX(prog, ptx) == 0
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
