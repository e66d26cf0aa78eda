"""numba's cache and the modules a kernel calls into.

numba keys a cached compiled function by its own source file only. A kernel that calls or inlines numba code
from another module (``kernels.lanes``' vector sums, ``kernels.spmm_cpu``'s walk) holds that code in its
cached machine code, so after an edit of the helper alone the cached kernel keeps running the old helper:
on 2026-11-26 an A/B timed a cached ES-SpMM kernel that still had the previous ``kernels.lanes`` sum.

So each ``kernels`` module that defines numba code carries one line naming the content digests of every other
module defining numba code that it reaches through its imports (any import form, directly, through a chain or
through a module that re-exports), each digest taken without that module's own key line::

    # numba cache key: lanes 3f2a9c01d4e5, spmm_cpu 9b1c77a0e2f3

An edit of a helper changes its digest; ``tests/test_cache_key.py`` fails until the lines are rewritten
(``python -m kernels.cache_key --write``), and a rewritten line changes its file, which numba then compiles
afresh. The rule covers imports and numba's decorators as the source spells them; code that reaches a module
some other way (``importlib``, a function handed in at run time) is not seen.
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
_DEFINES_NUMBA = re.compile(r"^\s*@(?:\w+\.)*(njit|jit|generated_jit|vectorize|guvectorize|cfunc|stencil|intrinsic|"
                            r"overload|overload_method|overload_attribute|register_jitable)\b", re.M)
_KEY_LINE = re.compile(rf"^{re.escape(KEY_PREFIX)}.*$", re.M)
_KEY_BLOCK = re.compile(rf"^{re.escape(KEY_PREFIX)}.*\n\n?", re.M)  # the line and the blank line write() puts after it


def _text(name: str, root: Path) -> str:
    return (root / f"{name}.py").read_text()


def numba_modules(root: Path = KERNELS) -> set[str]:
    """The modules of ``root`` that define numba code (a jitted function, an intrinsic or an overload)."""
    return {p.stem for p in root.glob("*.py") if _DEFINES_NUMBA.search(p.read_text())}


def _imports(name: str, root: Path) -> set[str]:
    """The modules of ``root`` that ``name`` imports, at any depth of the file and in any form (``from .x
    import``, ``from . import x``, ``import kernels.x``, ``from kernels.x import``, ``from kernels import x``)."""
    pkg = root.name
    found: set[str] = set()
    for node in ast.walk(ast.parse(_text(name, root))):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1 or (node.level == 0 and (mod == pkg or mod.startswith(f"{pkg}."))):
                sub = mod[len(pkg):].lstrip(".") if node.level == 0 else mod
                found |= {sub.split(".")[0]} if sub else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith(f"{pkg}.")}
    return {m for m in found if (root / f"{m}.py").is_file()} - {name}


def numba_deps(name: str, root: Path = KERNELS) -> list[str]:
    """The modules defining numba code whose code ``name``'s compiled code may hold: every such module it
    reaches through imports, directly or through other modules (a chain, a re-export), sorted; none when
    ``name`` defines no numba code itself."""
    numba_mods = numba_modules(root)
    if name not in numba_mods:
        return []
    seen: set[str] = set()
    todo = [name]
    while todo:
        for dep in _imports(todo.pop(), root):
            if dep not in seen and dep != name:
                seen.add(dep)
                todo.append(dep)
    return sorted(seen & numba_mods)


def _digest(name: str, root: Path) -> str:
    """The digest of a module's code without its own key line (the closure is listed in full, so no digest
    needs another's: no order, and a cycle is harmless)."""
    return hashlib.sha256(_KEY_BLOCK.sub("", _text(name, root)).encode()).hexdigest()[:12]


def expected_line(name: str, root: Path = KERNELS) -> str | None:
    """The key line ``name`` must carry, or None when it holds no other module's numba code."""
    deps = numba_deps(name, root)
    if not deps:
        return None
    return f"{KEY_PREFIX} " + ", ".join(f"{d} {_digest(d, root)}" for d in deps)


def stale(root: Path = KERNELS) -> list[str]:
    """One message per module whose key line is missing, wrong or not needed."""
    out = []
    for path in sorted(root.glob("*.py")):
        name = path.stem
        have = _KEY_LINE.findall(path.read_text())
        want = expected_line(name, root)
        if want is None and have:
            out.append(f"kernels/{name}.py: has {have[0]!r} but holds no other module's numba code")
        elif want is not None and have != [want]:
            out.append(f"kernels/{name}.py: wants {want!r}, has {have or 'no key line'}")
    return out


def write(root: Path = KERNELS) -> list[str]:
    """Rewrite every key line; returns the modules changed. A new line goes just before ``from __future__
    import annotations`` (or at the top), outside the import block."""
    changed = []
    for path in sorted(root.glob("*.py")):
        name = path.stem
        text = path.read_text()
        want = expected_line(name, root)
        if want is None:
            new = _KEY_BLOCK.sub("", text)
        elif _KEY_LINE.search(text):
            new = _KEY_LINE.sub(want, text, count=1)
        elif "from __future__ import annotations\n" in text:
            new = text.replace("from __future__ import annotations\n", f"{want}\n\nfrom __future__ import annotations\n", 1)
        else:
            new = f"{want}\n\n{text}"
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
