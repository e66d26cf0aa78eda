#!/usr/bin/env python3
"""Regenerate the committed gRPC/protobuf Python code in ``clients/_gen`` from the ``.proto`` files.

    python proto/generate.py            # rewrite clients/_gen
    python proto/generate.py --check    # exit 1 if the committed code differs from a fresh generation

Needs ``grpcio-tools`` (the version pinned in pyproject's test extra: the generated code embeds
it). The generated modules are flattened into one package and their imports made relative, so
``clients._gen`` works wherever the project is installed.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = REPO / "clients" / "_gen"
# .proto path (relative to proto/) -> flat module stem in clients/_gen
PROTOS = {
    "gnnserve/v1/gnnserve.proto": "gnnserve",
    "kserve/inference.proto": "inference",
}
INIT = '"""Generated protobuf/gRPC code (do not edit; run proto/generate.py)."""\n'


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # a dev-time dependency only

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for rel, stem in PROTOS.items():
            args = [
                "protoc",
                f"-I{HERE}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                str(HERE / rel),
            ]
            if protoc.main(args) != 0:
                raise SystemExit(f"protoc failed on {rel}")
            src_stem = Path(rel).stem
            src_dir = Path(tmp) / Path(rel).parent
            import_from = Path(rel).parent.as_posix().replace("/", ".")
            for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
                text = (src_dir / f"{src_stem}{suffix}").read_text()
                # "from gnnserve.v1 import gnnserve_pb2 as ..." -> "from . import gnnserve_pb2 as ..."
                text = re.sub(
                    rf"^from {re.escape(import_from)} import {src_stem}_pb2",
                    f"from . import {stem}_pb2",
                    text,
                    flags=re.M,
                )
                text = text.replace(f"{src_stem}_pb2", f"{stem}_pb2")
                (out_dir / f"{stem}{suffix}").write_text(text)
    (out_dir / "__init__.py").write_text(INIT)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed code instead of writing")
    args = ap.parse_args(argv)
    if not args.check:
        if OUT.exists():
            shutil.rmtree(OUT)
        generate(OUT)
        print(f"wrote {OUT}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "_gen"
        generate(fresh)
        names = sorted(p.name for p in fresh.iterdir())
        committed = sorted(p.name for p in OUT.iterdir() if p.is_file() and p.suffix in (".py", ".pyi"))
        _, mismatch, errors = filecmp.cmpfiles(fresh, OUT, names, shallow=False)
        extra = sorted(set(committed) - set(names))
        if mismatch or errors or extra:
            print(f"generated code is stale: differs={mismatch} missing={errors} extra={extra}", file=sys.stderr)
            print("run: python proto/generate.py", file=sys.stderr)
            return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
