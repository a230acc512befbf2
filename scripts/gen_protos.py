"""Generate Python stubs (and type stubs, when mypy-protobuf is installed) from protos/ into
quarry/v1/. Never edit the output. The package build (setup.py) calls `generate` too.

Usage: python scripts/gen_protos.py
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"


def generate(out: Path = ROOT, type_stubs: bool = True) -> int:
    """Write quarry/v1/*_pb2*.py under `out` (a source tree or a build directory); 0 on success."""
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "quarry" / "v1").glob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    (out / "quarry" / "v1").mkdir(parents=True, exist_ok=True)
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}"]
    # mypy-protobuf's plugins live beside this interpreter; type stubs are optional but wanted.
    bindir = Path(sys.executable).parent
    if type_stubs and ((bindir / "protoc-gen-mypy").exists() or shutil.which("protoc-gen-mypy")):
        os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
        args += [f"--mypy_out={out}", f"--mypy_grpc_out={out}"]
    rc = protoc.main(args + protos)
    if rc != 0:
        print(f"protoc failed with exit code {rc}", file=sys.stderr)
        return rc
    print(f"generated {len(protos)} proto files into {out / 'quarry' / 'v1'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(generate())
