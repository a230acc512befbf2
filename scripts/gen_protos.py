"""Generate Python stubs and type stubs from protos/ into quarry/v1/ (never edit the output).

Usage: python scripts/gen_protos.py
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT = ROOT


def main() -> int:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "quarry" / "v1").glob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={OUT}",
        f"--grpc_python_out={OUT}",
    ]
    # mypy-protobuf's plugins live beside this interpreter; type stubs are optional but wanted.
    bindir = Path(sys.executable).parent
    mypy_plugin = bindir / "protoc-gen-mypy"
    if mypy_plugin.exists() or shutil.which("protoc-gen-mypy"):
        os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
        args += [f"--mypy_out={OUT}", f"--mypy_grpc_out={OUT}"]
    rc = protoc.main(args + protos)
    if rc != 0:
        print(f"protoc failed with exit code {rc}", file=sys.stderr)
        return rc
    print(f"generated {len(protos)} proto files into {OUT / 'quarry' / 'v1'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
