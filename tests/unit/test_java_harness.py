"""tests/e2e/java.py fails a test, never skips it, when Java or the built drivers are missing,
and says what is missing and which make target brings it (issue 35)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import java


def test_no_java_fails_naming_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=r"no java on PATH.*make java-clients"):
        java.java_binary()


def test_drivers_not_built_fails_naming_the_make_target(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(java, "TARGET", tmp_path / "target")
    monkeypatch.setattr(java, "CLASSES", tmp_path / "target" / "classes")
    monkeypatch.setattr(java, "JARS", tmp_path / "target" / "dependency")
    monkeypatch.setattr(java, "STAMP", tmp_path / "target" / ".built")
    with pytest.raises(pytest.fail.Exception, match=r"not built.*make java-clients"):
        java.classpath()


def test_jvm_flags_keep_the_heap_small() -> None:
    assert "-Xmx256m" in java.JVM_FLAGS and any(f.startswith("-Xms") for f in java.JVM_FLAGS)
