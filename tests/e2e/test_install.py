"""The package as a user installs it: `pip install --no-deps .` into a fresh virtualenv outside the
repository gives one top-level import package, `quarry`, and console scripts that work there.

To stay fast and offline, the fresh venv has no pip of its own and no dependencies: pip, the build
tools (setuptools, grpcio-tools) and the runtime dependencies come from this interpreter's
site-packages through PYTHONPATH. A PYTHONPATH entry is not a site directory, so its .pth files (the
editable install's finder that maps quarry.* to this source tree) are not processed: what imports
as `quarry` in the fresh venv is the installed copy only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from tests import dockerfile
from tests.vectors import REPO_ROOT

DEV_SITE = sysconfig.get_paths()["purelib"]
SCRIPTS = ("quarry", "quarry-router", "quarry-commitlog", "quarry-indexer", "quarry-pipeline", "quarry-console")
HINT = "import quarry.services, not services"


class FreshVenv:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.python = self.bin / "python"
        self.wheel = Path()
        self.site = Path(subprocess.run([str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        capture_output=True, text=True, check=True, env=self.env()).stdout.strip())

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        return {**env, "PYTHONPATH": DEV_SITE, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1", **extra}

    def run(self, *argv: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=cwd, env=self.env(**extra), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshVenv]:
    root = tmp_path_factory.mktemp("fresh-venv")
    assert not root.resolve().is_relative_to(REPO_ROOT)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root / "venv")
    env = FreshVenv(root / "venv")
    # What the Dockerfile does: its build stage's COPY lines over the .dockerignore'd context (so
    # no .venv, generated code or egg-info), `pip wheel` there, then the services stage's install.
    src = root / "src"
    dockerfile.assemble(_stage("build"), src)
    wheel = env.run(str(env.python), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "--wheel-dir", str(root / "wheels"), ".", cwd=src)
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    env.wheel = next((root / "wheels").glob("quarry-*.whl"))
    install = env.run(str(env.python), "-m", "pip", "install", "--no-deps", "-q", str(env.wheel), cwd=root)
    assert install.returncode == 0, install.stdout + install.stderr
    yield env


def _stage(name: str) -> dockerfile.Stage:
    return next(s for s in dockerfile.stages() if s.name == name)


def test_only_quarry_is_a_top_level_package(installed: FreshVenv) -> None:
    entries = {p.name for p in installed.site.iterdir() if p.name != "__pycache__"}
    assert entries == {"quarry", "quarry-0.1.0.dist-info"}, entries
    record = (installed.site / "quarry-0.1.0.dist-info" / "RECORD").read_text().splitlines()
    tops = {line.split(",")[0].split("/")[0] for line in record if not line.startswith("..")}
    assert tops == {"quarry", "quarry-0.1.0.dist-info"}, tops
    for sub in ("formats", "services/commitlog", "services/indexer", "services/query", "clients", "pipeline", "v1"):
        assert (installed.site / "quarry" / sub / "__init__.py").is_file(), sub
    assert list((installed.site / "quarry" / "v1").glob("*_pb2_grpc.py")), "the build generates quarry.v1"
    for page in ("index.html", "app.js", "app.css"):  # quarry-console's pages ship as package data
        assert (installed.site / "quarry" / "clients" / "console" / "static" / page).is_file(), page


def test_installed_modules_come_from_site_packages_not_the_source_tree(installed: FreshVenv, tmp_path: Path) -> None:
    probe = "import quarry.services.commitlog, quarry.formats.record, quarry.v1.router_pb2 as r; print(quarry.services.commitlog.__file__); print(r.__file__)"
    out = installed.run(str(installed.python), "-c", probe, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        assert Path(line).is_relative_to(installed.site), line


@pytest.mark.parametrize("script", SCRIPTS)
def test_console_script_answers_help_outside_the_repository(installed: FreshVenv, script: str, tmp_path: Path) -> None:
    out = installed.run(str(installed.bin / script), "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "usage:" in out.stdout.lower(), out.stdout


@pytest.mark.parametrize("command", ["router", "commitlog", "indexer", "probe", "cli"])
def test_the_services_image_entrypoint_runs_every_command(installed: FreshVenv, command: str, tmp_path: Path) -> None:
    entry = json.loads(_stage("services").all("ENTRYPOINT")[-1])
    assert entry[0] == "python"
    out = installed.run(str(installed.bin / "python"), *entry[1:], command, "--help", cwd=tmp_path)
    assert out.returncode == 0 and "usage" in out.stdout.lower(), out.stdout + out.stderr


def test_the_pipeline_image_install_resolves_the_extra(installed: FreshVenv, tmp_path: Path) -> None:
    """`pip install <wheel>[pipeline]` as the pipeline stage runs it: the extra's pins resolve
    (offline: pyspark and its py4j come from the development environment)."""
    assert any("[pipeline]" in run for run in _stage("pipeline").all("RUN"))
    out = installed.run(str(installed.python), "-m", "pip", "install", "--dry-run", "--report", "-", "-q", f"{installed.wheel}[pipeline]", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    entry = json.loads(_stage("pipeline").all("ENTRYPOINT")[-1])
    run = installed.run(str(installed.bin / entry[0]), "--help", cwd=tmp_path)
    assert run.returncode == 0, run.stderr


def test_bare_names_do_not_import_outside_the_repository(installed: FreshVenv, tmp_path: Path) -> None:
    for name in ("services", "formats", "clients", "pipeline", "bench", "scripts"):
        out = installed.run(str(installed.python), "-c", f"import {name}", cwd=tmp_path)
        assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr, (name, out.stderr)


def test_pipeline_code_zip_from_the_installed_layout_imports_alone(installed: FreshVenv, tmp_path: Path) -> None:
    """--py-files for a cluster: the zip built from site-packages holds every module the executors import."""
    made = installed.run(str(installed.python), "-c", f"from pathlib import Path; from quarry.pipeline.session import build_code_zip; print(build_code_zip(Path({str(tmp_path)!r})))", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    _assert_zip_imports_alone(Path(made.stdout.strip()), tmp_path)


def test_pipeline_code_zip_from_the_editable_layout_imports_alone(tmp_path: Path) -> None:
    from quarry.pipeline.session import build_code_zip

    _assert_zip_imports_alone(build_code_zip(tmp_path), tmp_path)


def _assert_zip_imports_alone(zip_path: Path, cwd: Path) -> None:
    names = zipfile.ZipFile(zip_path).namelist()
    assert "quarry/formats/record.py" in names and not any(n.startswith(("formats/", "services/", "pipeline/")) for n in names)
    assert not any(n.startswith("quarry/services/") for n in names)  # executors run no services code
    # -S: no site-packages at all, so quarry can only come from the zip (its dependencies from DEV_SITE).
    probe = "import quarry.pipeline.jobs, quarry.pipeline.reindex, quarry.pipeline.export, quarry.pipeline.lookup, quarry.formats.record, quarry.v1.common_pb2 as c; print(c.__file__)"
    out = subprocess.run([sys.executable, "-S", "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": f"{zip_path}{os.pathsep}{DEV_SITE}"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(zip_path)), out.stdout


def test_import_services_in_the_repository_root_fails_with_the_hint() -> None:
    for name, hint in (("services", HINT), ("formats", "import quarry.formats"), ("clients", "import quarry.clients"), ("pipeline", "import quarry.pipeline")):
        out = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and hint in out.stderr, (name, out.stderr)
