"""The images, checked without a Docker engine: both install the package built as a wheel (no
source tree, no PYTHONPATH); the services image (the default target) has neither a JRE nor
PySpark; the pipeline image has both; .dockerignore sends only what the build stage copies.
tests/e2e/test_install.py runs the build stage's `pip wheel` on exactly that context."""
from __future__ import annotations

import re

import pytest

from tests import dockerfile
from tests.vectors import REPO_ROOT

STAGES = {s.name: s for s in dockerfile.stages()}


def test_stages_and_default_target() -> None:
    assert list(STAGES) == ["build", "runtime", "pipeline", "services"]
    assert dockerfile.stages()[-1].name == "services"  # `docker build .` and compose's `build: .`
    assert STAGES["pipeline"].base == STAGES["services"].base == "runtime"


def test_images_install_the_wheel_not_a_source_tree() -> None:
    assert not any("PYTHONPATH" in s.text() for s in STAGES.values())
    assert any(re.search(r"pip wheel --no-deps --wheel-dir /wheels \.$", r) for r in STAGES["build"].all("RUN"))
    for name in ("runtime", "pipeline", "services"):
        copies = STAGES[name].all("COPY")
        assert all(c.split()[-1].startswith("/tmp/") for c in copies), (name, copies)  # only requirements.txt, then removed
    assert any("pip install --no-deps /wheels/quarry-*.whl" in r for r in STAGES["services"].all("RUN"))


def test_runtime_dependencies_are_the_pinned_requirements_without_pyspark() -> None:
    assert any("pip install -r /tmp/requirements.txt" in r for r in STAGES["runtime"].all("RUN"))
    reqs = [line.split("==")[0].strip().lower() for line in (REPO_ROOT / "requirements.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert reqs and "pyspark" not in reqs and "grpcio-tools" not in reqs


@pytest.mark.parametrize("word", ["openjdk", "java", "jre", "pyspark", "[pipeline]", "apt-get"])
def test_services_image_has_no_jre_and_no_pyspark(word: str) -> None:
    for name in ("runtime", "services"):
        assert word not in STAGES[name].text().lower(), (name, word)


def test_pipeline_image_has_a_jre_and_the_pipeline_extra() -> None:
    runs = " ".join(STAGES["pipeline"].all("RUN"))
    assert "openjdk-17-jre-headless" in runs  # the runtime scripts/ensure_java.sh installs for make
    assert "openjdk-17-jre-headless" in (REPO_ROOT / "scripts" / "ensure_java.sh").read_text()
    assert "[pipeline]" in runs
    assert STAGES["pipeline"].all("ENTRYPOINT") == ['["quarry-pipeline"]']


@pytest.mark.parametrize("name", ["pipeline", "services"])
def test_images_run_as_an_unprivileged_user(name: str) -> None:
    assert STAGES[name].all("USER")[-1] == "quarry"


def test_dockerignore_keeps_what_the_build_copies_and_nothing_else() -> None:
    rules = dockerfile.ignore_rules()
    kept = dockerfile.context_files()
    for must in ("pyproject.toml", "setup.py", "README.md", "requirements.txt", "scripts/gen_protos.py",
                 "protos/quarry/v1/common.proto", "formats/record.py", "services/commitlog/doors/quarry_v1.py",
                 "services/indexer/doors/quarry_v1.py", "services/query/doors/quarry_v1.py", "clients/cli.py", "pipeline/cli.py"):
        assert must in kept, must
    for never in ("tests/golden/msgid.json", "tests/unit/test_settings.py", "bench/runner.py", "docs/containers.md",
                  ".venv/bin/python", ".git/HEAD", "quarry/v1/common_pb2.py", "quarry/v1/common_pb2_grpc.py",
                  "formats/__pycache__/record.cpython-311.pyc", "quarry.egg-info/PKG-INFO", "var/store/x", "compose.yaml"):
        assert dockerfile.excluded(never, rules), never
    top = {f.split("/")[0] for f in kept}
    assert top <= {"pyproject.toml", "setup.py", "README.md", "requirements.txt", "scripts", "protos", "quarry",
                   "formats", "services", "clients", "pipeline"}, top
    assert [f for f in kept if f.startswith("scripts/")] == ["scripts/gen_protos.py"]


def test_every_build_stage_copy_finds_its_files_in_the_context(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dockerfile.assemble(STAGES["build"], tmp_path)
    assert (tmp_path / "pyproject.toml").is_file() and (tmp_path / "scripts" / "gen_protos.py").is_file()
    assert (tmp_path / "formats" / "record.py").is_file() and (tmp_path / "protos" / "quarry" / "v1" / "router.proto").is_file()
    assert not list(tmp_path.rglob("*_pb2*.py"))


def test_dockerignore_matcher_follows_docker_rules() -> None:
    rules = [(False, dockerfile._pattern_regex("*")), (True, dockerfile._pattern_regex("formats")),
             (False, dockerfile._pattern_regex("**/__pycache__")), (True, dockerfile._pattern_regex("protos/quarry/v1/*.proto"))]
    assert dockerfile.excluded("tests/x.py", rules)
    assert not dockerfile.excluded("formats/record.py", rules)
    assert dockerfile.excluded("formats/__pycache__/a.pyc", rules)
    assert not dockerfile.excluded("protos/quarry/v1/a.proto", rules)
    assert dockerfile.excluded("protos/quarry/v1/sub/a.proto", rules)


def test_compose_builds_the_services_target() -> None:
    import json

    from tests.contract.test_compose import compose_config

    services = json.loads(compose_config(REPO_ROOT / "compose.yaml").stdout)["services"]
    for name, svc in services.items():
        assert svc["build"]["target"] == "services" and svc["build"]["dockerfile"] == "Dockerfile", name
        assert svc["build"]["target"] in STAGES
