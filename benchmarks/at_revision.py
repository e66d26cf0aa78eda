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


def _changed_since(rev: str, name: str) -> bool:
    """Whether ``kernels/<name>.py`` differs between ``rev`` and this working tree."""
    return subprocess.run(["git", "diff", "--quiet", rev, "--", f"kernels/{name}.py"], cwd=REPO).returncode != 0


def kernels_module_at(rev: str, name: str, workdir: Path) -> Any:
    """``kernels/<name>.py`` at git revision ``rev``, imported as ``kernels._<name>_at_base`` from a copy in
    ``workdir``. Its relative imports resolve to this tree's ``kernels``, except a module it imports that has
    changed since ``rev`` as well (``kernels/lanes.py`` beside the kernel that calls it): that one is loaded at
    ``rev`` too, the same way, so the base runs the base's code throughout (an edit of a helper alone would
    otherwise reach both sides). numba compiles it afresh, so time it after a first call. Exits with git's
    message when the revision or file does not exist."""
    got = subprocess.run(["git", "show", "--end-of-options", f"{rev}:kernels/{name}.py"], cwd=REPO, capture_output=True,
                         text=True)
    if got.returncode != 0:
        raise SystemExit(f"--base {rev}: {got.stderr.strip()}")
    source = got.stdout
    for dep in sorted(set(re.findall(r"^from \.(\w+) import", source, flags=re.M))):
        if (REPO / "kernels" / f"{dep}.py").is_file() and _changed_since(rev, dep):
            kernels_module_at(rev, dep, workdir)
            source = re.sub(rf"^from \.{dep} import", f"from ._{dep}_at_base import", source, flags=re.M)
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
    return module
