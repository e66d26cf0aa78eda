"""kernels.cache_key: a kernel that calls numba code of another module names that module's digest, so numba's
cache, keyed by the kernel's own file, compiles the kernel afresh after an edit of the helper alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from kernels import cache_key

REPO = Path(__file__).resolve().parent.parent


def test_every_kernel_names_the_helpers_it_was_compiled_with():
    problems = cache_key.stale()
    assert not problems, "\n".join(problems) + "\nrun `python -m kernels.cache_key --write`"
    assert cache_key.numba_deps("spmm_cpu") == ["lanes"]  # the case that went stale on 2026-11-26
    assert {"lanes", "spmm_cpu", "plan"} <= set(cache_key.numba_deps("fused_forward"))
    assert "lanes" in cache_key.numba_deps("plan")  # plan calls spmm_cpu's walk, compiled with lanes beside it


def _package(tmp_path: Path) -> Path:
    """``top`` (cached) calls ``mid`` (jitted, not cached), which calls ``base``; ``reexp`` (no numba code)
    re-exports ``base``'s function, which ``side`` (cached) imports as ``from . import reexp``; ``plain``
    holds no numba code."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "base.py").write_text("import numba\n\n\n@numba.njit(inline='always')\ndef one():\n    return 1\n")
    (root / "mid.py").write_text("from __future__ import annotations\n\nimport numba as nb\n\nfrom .base import one\n\n\n"
                                 "@nb.njit\ndef two():\n    return one() + 1\n")
    (root / "top.py").write_text("import numba\n\nfrom .mid import two\n\n\n@numba.njit(cache=True)\n"
                                 "def three():\n    return two() + 1\n")
    (root / "reexp.py").write_text("from .base import one\n")
    (root / "side.py").write_text("from numba import njit\n\nfrom . import reexp\n\n\ndef make():\n"
                                  "    @njit(cache=True)\n    def f():\n        return reexp.one()\n    return f\n")
    (root / "plain.py").write_text("from .mid import two\n")
    return root


def test_an_edit_of_a_helper_changes_every_file_that_holds_its_code(tmp_path):
    root = _package(tmp_path)
    assert cache_key.numba_modules(root) == {"base", "mid", "top", "side"}
    assert cache_key.numba_deps("top", root) == ["base", "mid"]  # through the uncached middle
    assert cache_key.numba_deps("side", root) == ["base"]  # through the re-export, `from . import`
    assert cache_key.numba_deps("plain", root) == [] and cache_key.numba_deps("base", root) == []
    assert len(cache_key.stale(root)) == 3
    assert cache_key.write(root) == ["mid", "side", "top"]
    assert cache_key.stale(root) == [] and cache_key.write(root) == []
    before = {n: (root / f"{n}.py").read_text() for n in ("mid", "top", "side")}
    assert "\n\nfrom __future__ import annotations" in before["mid"]
    assert "numba cache key" not in (root / "plain.py").read_text()

    (root / "base.py").write_text((root / "base.py").read_text().replace("return 1", "return 10"))  # the helper only
    assert {p.split(":")[0] for p in cache_key.stale(root)} == {"kernels/mid.py", "kernels/top.py", "kernels/side.py"}
    assert cache_key.write(root) == ["mid", "side", "top"]  # one pass: no line depends on another's
    assert all((root / f"{n}.py").read_text() != before[n] for n in before)
    assert cache_key.stale(root) == []


def test_a_cycle_and_a_line_no_longer_needed(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text("import numba\n\nfrom .b import g\n\n\n@numba.njit(cache=True)\ndef f():\n    return g()\n")
    (root / "b.py").write_text("import numba\n\nfrom . import a\n\n\n@numba.njit\ndef g():\n    return 1\n")
    assert cache_key.write(root) == ["a", "b"] and cache_key.stale(root) == []
    (root / "a.py").write_text((root / "a.py").read_text().replace("from .b import g", "g = None"))
    assert cache_key.write(root) == ["a", "b"]  # a drops its line; b holds a digest of a
    assert "numba cache key" not in (root / "a.py").read_text()
    assert cache_key.stale(root) == []


def test_the_command_and_an_edit_of_lanes(tmp_path):
    """``python -m kernels.cache_key`` passes on this tree; in a copy where only kernels/lanes.py was edited,
    every kernel module that compiles its vectors into its cached code is named (kernels.dense: its tiles' IR
    broadcasts with lanes.splat)."""
    ok = subprocess.run([sys.executable, "-m", "kernels.cache_key"], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    copy = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "lanes.py").write_text((copy / "lanes.py").read_text() + "\n# an edit\n")
    named = {p.split(":")[0] for p in cache_key.stale(copy)}
    assert named == {"kernels/spmm_cpu.py", "kernels/fused_forward.py", "kernels/plan.py", "kernels/dense.py"}
