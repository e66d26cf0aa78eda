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


def _package(tmp_path: Path) -> Path:
    """A three-module chain: ``top`` caches code calling ``mid``, which caches code calling ``base``."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "base.py").write_text("import numba\n\n\n@numba.njit(inline='always')\ndef one():\n    return 1\n")
    (root / "mid.py").write_text("from __future__ import annotations\n\nimport numba\n\nfrom .base import one\n\n\n"
                                 "@numba.njit(cache=True)\ndef two():\n    return one() + 1\n")
    (root / "top.py").write_text("import numba\n\nfrom .mid import two\n\n\n@numba.njit(cache=True)\n"
                                 "def three():\n    return two() + 1\n")
    (root / "plain.py").write_text("from .mid import two\n")  # caches nothing: needs no key
    return root


def test_an_edit_of_a_helper_changes_every_file_that_holds_its_code(tmp_path):
    root = _package(tmp_path)
    assert len(cache_key.stale(root)) == 2
    assert cache_key.write(root) == ["mid", "top"]
    assert cache_key.stale(root) == [] and cache_key.write(root) == []
    mid_before, top_before = (root / "mid.py").read_text(), (root / "top.py").read_text()
    assert cache_key.expected_line("mid", root) in mid_before and "\n\nfrom __future__ import annotations" in mid_before
    assert cache_key.expected_line("plain", root) is None and "numba cache key" not in (root / "plain.py").read_text()

    (root / "base.py").write_text((root / "base.py").read_text().replace("return 1", "return 10"))  # the helper only
    assert [p.split(":")[0] for p in cache_key.stale(root)] == ["kernels/mid.py"]  # top follows once mid changes
    assert cache_key.write(root) == ["mid", "top"]  # the chain settles in one pass
    assert (root / "mid.py").read_text() != mid_before and (root / "top.py").read_text() != top_before
    assert cache_key.stale(root) == []


def test_the_command_and_an_edit_of_lanes(tmp_path):
    """``python -m kernels.cache_key`` passes on this tree; in a copy where only kernels/lanes.py was edited,
    both kernels that compile its vectors into their cached code are named."""
    ok = subprocess.run([sys.executable, "-m", "kernels.cache_key"], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    copy = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "lanes.py").write_text((copy / "lanes.py").read_text() + "\n# an edit\n")
    named = {p.split(":")[0] for p in cache_key.stale(copy)}
    assert named == {"kernels/spmm_cpu.py", "kernels/fused_forward.py"}
