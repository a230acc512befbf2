"""Build hook: generate quarry/v1 from protos/ whenever the package is built (pip install .,
pip install -e ., wheels). Everything else about the package is in pyproject.toml."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithProtos(build_py):
    def run(self) -> None:
        spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
        assert spec and spec.loader
        gen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gen)
        # An editable install imports from the source tree; a wheel from the build directory.
        # Type stubs need mypy-protobuf, a development tool: `make gen` writes them.
        out = ROOT if self.editable_mode else Path(self.build_lib)
        if gen.generate(out, type_stubs=False) != 0:  # type stubs: `make gen`
            raise SystemExit("protobuf code generation failed")
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
