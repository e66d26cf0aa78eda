"""numba's cache and the modules a kernel calls into.

numba keys a cached compiled function by its own source file only. A kernel that calls or inlines numba code
from another module (``kernels.lanes``' vector sums, ``kernels.spmm_cpu``'s walk) holds that code in its
cached machine code, so after an edit of the helper alone the cached kernel keeps running the old helper:
on 2026-11-26 an A/B timed a cached ES-SpMM kernel that still had the previous ``kernels.lanes`` sum.

So each ``kernels`` module that caches compiled code (``cache=True``) and imports from a module defining numba
code carries one line naming the content digests of those modules::

    # numba cache key: lanes 3f2a9c01d4e5, spmm_cpu 9b1c77a0e2f3

An edit of a helper changes its digest; ``tests/test_cache_key.py`` fails until the line is rewritten
(``python -m kernels.cache_key --write``), and the rewritten line changes the dependent file, which numba then
compiles afresh. A digest covers the whole file, its own line included, so the rule carries through chains
(``fused_forward`` -> ``plan`` -> ``spmm_cpu`` -> ``lanes``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import sys
from pathlib import Path

__all__ = ["KEY_PREFIX", "expected_line", "numba_deps", "numba_modules", "stale", "write"]

KERNELS = Path(__file__).resolve().parent
KEY_PREFIX = "# numba cache key:"
_DEFINES_NUMBA = re.compile(r"^@(numba\.)?(njit|jit|generated_jit|vectorize|guvectorize)\b|^@(intrinsic|overload|"
                            r"register_jitable)\b", re.M)
_KEY_LINE = re.compile(rf"^{re.escape(KEY_PREFIX)}.*$", re.M)


def numba_modules(root: Path = KERNELS) -> set[str]:
    """The modules of ``root`` that define numba code (a jitted function, an intrinsic or an overload)."""
    return {p.stem for p in root.glob("*.py") if _DEFINES_NUMBA.search(p.read_text())}


def numba_deps(name: str, root: Path = KERNELS) -> list[str]:
    """The modules defining numba code that ``name`` imports from (``from .mod import ...``, at any depth of
    the file), sorted; none when ``name`` caches no compiled code of its own (``cache=True``)."""
    text = (root / f"{name}.py").read_text()
    if "cache=True" not in text:
        return []
    tree = ast.parse(text)
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}
    return sorted((found & numba_modules(root)) - {name})


def _digest(name: str, root: Path) -> str:
    return hashlib.sha256((root / f"{name}.py").read_bytes()).hexdigest()[:12]


def expected_line(name: str, root: Path = KERNELS) -> str | None:
    """The key line ``name`` must carry, or None when it imports no numba code."""
    deps = numba_deps(name, root)
    if not deps:
        return None
    return f"{KEY_PREFIX} " + ", ".join(f"{d} {_digest(d, root)}" for d in deps)


def _order(root: Path) -> list[str]:
    """Every module, each after the numba modules it imports (their lines are written first)."""
    done: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        if name in visiting:
            raise RuntimeError(f"kernels.{name} imports numba code in a cycle: no key line can be stable")
        visiting.add(name)
        for dep in numba_deps(name, root):
            visit(dep)
        visiting.discard(name)
        done.append(name)

    for p in sorted(root.glob("*.py")):
        visit(p.stem)
    return done


def stale(root: Path = KERNELS) -> list[str]:
    """One message per module whose key line is missing, wrong or not needed."""
    out = []
    for name in _order(root):
        text = (root / f"{name}.py").read_text()
        have = _KEY_LINE.findall(text)
        want = expected_line(name, root)
        if want is None and have:
            out.append(f"kernels/{name}.py: has {have[0]!r} but imports no numba code")
        elif want is not None and have != [want]:
            out.append(f"kernels/{name}.py: wants {want!r}, has {have or 'no key line'}")
    return out


def write(root: Path = KERNELS) -> list[str]:
    """Rewrite every key line (helpers first, so a chain settles in one pass); returns the modules changed.
    A new line goes just before ``from __future__ import annotations`` (or at the top), outside the import block."""
    changed = []
    for name in _order(root):
        path = root / f"{name}.py"
        text = path.read_text()
        want = expected_line(name, root)
        if want is None:
            new = _KEY_LINE.sub("", text).replace("\n\n\n\n", "\n\n\n") if _KEY_LINE.search(text) else text
        elif _KEY_LINE.search(text):
            new = _KEY_LINE.sub(want, text, count=1)
        elif "from __future__ import annotations\n" in text:
            new = text.replace("from __future__ import annotations\n", f"{want}\n\nfrom __future__ import annotations\n", 1)
        else:
            new = f"{want}\n{text}"
        if new != text:
            path.write_text(new)
            changed.append(name)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.cache_key", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the key lines instead of checking them")
    args = ap.parse_args(argv)
    if args.write:
        changed = write()
        print("rewrote " + (", ".join(f"kernels/{c}.py" for c in changed) if changed else "nothing"))
        return 0
    problems = stale()
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print("run `python -m kernels.cache_key --write`", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
