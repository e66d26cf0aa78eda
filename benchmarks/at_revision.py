"""One module of the ``kernels`` package as it was at a git revision, imported beside this tree's: the
A/B of a change to a kernel in one process, same inputs, interleaved rounds (``fused.py --base``,
``kernels.py --base``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def kernels_module_at(rev: str, name: str, workdir: Path) -> Any:
    """``kernels/<name>.py`` at git revision ``rev``, imported as ``kernels._<name>_at_base`` from a copy in
    ``workdir`` (its relative imports resolve to this tree's ``kernels``; numba compiles it afresh, so
    time it after a first call). Exits with git's message when the revision or file does not exist."""
    got = subprocess.run(["git", "show", "--end-of-options", f"{rev}:kernels/{name}.py"], cwd=REPO, capture_output=True,
                         text=True)
    if got.returncode != 0:
        raise SystemExit(f"--base {rev}: {got.stderr.strip()}")
    path = workdir / f"{name}_at_base.py"
    path.write_text(got.stdout)
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
    return module
