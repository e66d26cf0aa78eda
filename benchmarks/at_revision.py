"""One module of the ``kernels`` package as it was at a git revision, imported beside this tree's: the
A/B of a change to a kernel in one process, same inputs, interleaved rounds (``fused.py --base``,
``kernels.py --base``)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


_SHOWN: dict[tuple[str, str], subprocess.CompletedProcess[str]] = {}
_LOADED: dict[tuple[str, str], Any] = {}


def _show(rev: str, name: str) -> subprocess.CompletedProcess[str]:
    """``git show rev:kernels/<name>.py``, once per revision and module."""
    if (rev, name) not in _SHOWN:
        _SHOWN[rev, name] = subprocess.run(["git", "show", "--end-of-options", f"{rev}:kernels/{name}.py"], cwd=REPO,
                                           capture_output=True, text=True)
    return _SHOWN[rev, name]


def _source_at(rev: str, name: str) -> str | None:
    """``kernels/<name>.py`` at ``rev`` (None where it does not exist there)."""
    got = _show(rev, name)
    return got.stdout if got.returncode == 0 else None


def _relative_imports(source: str) -> set[str]:
    return set(re.findall(r"^\s*from \.(\w+) import", source, flags=re.M))


def _runs_other_code(rev: str, name: str, numba_mods: set[str], seen: frozenset[str] = frozenset()) -> bool:
    """Whether numba module ``name`` at ``rev`` differs from this tree's, itself or through a numba module it
    imports (its compiled code holds theirs)."""
    source = _source_at(rev, name)
    if source is None or name in seen:
        return False
    if source != (REPO / "kernels" / f"{name}.py").read_text():
        return True
    return any(_runs_other_code(rev, d, numba_mods, seen | {name}) for d in _relative_imports(source) & numba_mods)


def kernels_module_at(rev: str, name: str, workdir: Path) -> Any:
    """``kernels/<name>.py`` at git revision ``rev``, imported as ``kernels._<name>_at_base`` from a copy in
    ``workdir`` (once per revision and module). Its relative imports resolve to this tree's ``kernels``, except
    the modules defining numba code (:func:`kernels.cache_key.numba_modules`) whose code at ``rev`` differs from
    this tree's, themselves or through theirs: those are loaded at ``rev`` too, the same way, so the base runs
    the base's compiled code throughout (``kernels/lanes.py`` beside the kernel that calls it; an edit of a
    helper alone would otherwise reach both sides). Plain modules (``graph``, ``spmm``) stay this tree's, so
    the objects a benchmark hands in are of the classes the base's code sees. numba compiles it afresh, so time
    it after a first call. Exits with git's message when the revision or file does not exist."""
    if (rev, name) in _LOADED:
        return _LOADED[rev, name]
    from kernels.cache_key import numba_modules

    source = _source_at(rev, name)
    if source is None:
        raise SystemExit(f"--base {rev}: {_show(rev, name).stderr.strip()}")
    numba_mods = numba_modules()
    for dep in sorted(_relative_imports(source) & numba_mods - {name}):
        if _runs_other_code(rev, dep, numba_mods):
            kernels_module_at(rev, dep, workdir)
            source = re.sub(rf"^(\s*)from \.{dep} import", rf"\1from ._{dep}_at_base import", source, flags=re.M)
    path = workdir / f"{name}_at_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"kernels._{name}_at_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # e.g. an import of something this tree no longer has
        del sys.modules[spec.name]
        raise SystemExit(f"--base {rev}: kernels/{name}.py of that revision does not load beside this tree: "
                         f"{type(exc).__name__}: {exc}") from exc
    _LOADED[rev, name] = module
    return module
