"""Reading the Dockerfile and .dockerignore without a Docker engine: the stages with their
instructions, the build context .dockerignore leaves, and the source tree the build stage's COPY
lines assemble from it (so a test can run the same `pip wheel` on exactly those files)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tests.vectors import REPO_ROOT


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, rest of the line)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]

    def text(self) -> str:
        return "\n".join(f"{kw} {rest}" for kw, rest in self.instructions)


def stages(path: Path = REPO_ROOT / "Dockerfile") -> list[Stage]:
    """The stages in order; continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    out: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.I)
            assert m, f"FROM line not understood: {line}"
            out.append(Stage(name=m.group(2) or str(len(out)), base=m.group(1)))
        else:
            assert out, f"instruction before FROM: {line}"
            out[-1].instructions.append((keyword, rest.strip()))
    return out


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over slash paths."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def ignore_rules(path: Path = REPO_ROOT / ".dockerignore") -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        rules.append((exception, _pattern_regex(line.lstrip("!").strip().strip("/"))))
    return rules


def excluded(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories wins."""
    parts = relative.split("/")
    candidates = [relative] + ["/".join(parts[:i]) for i in range(1, len(parts))]
    verdict = False
    for exception, regex in rules:
        if any(regex.match(c) for c in candidates):
            verdict = not exception
    return verdict


def context_files(root: Path = REPO_ROOT) -> list[str]:
    """Files of the working tree that the build context keeps (.git and .venv, large and
    excluded by `*` anyway, are not walked)."""
    rules = ignore_rules(root / ".dockerignore")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not (here == root and d in (".git", ".venv")))
        # A link to a folder (quarry/formats -> ../formats) is one entry of the context, kept as a
        # link by COPY; os.walk lists it among the folders and does not enter it.
        links = [d for d in dirnames if (here / d).is_symlink()]
        for name in [*filenames, *links]:
            rel = (here / name).relative_to(root).as_posix()
            if not excluded(rel, rules):
                found.append(rel)
    return sorted(found)


def assemble(stage: Stage, dest: Path, root: Path = REPO_ROOT) -> None:
    """Do the stage's `COPY <src>… <dst>` lines (relative to its WORKDIR) from the filtered context into dest."""
    keep = set(context_files(root))
    for kw, rest in stage.instructions:
        if kw != "COPY" or rest.startswith("--from"):
            continue
        *sources, target = shlex.split(rest)
        assert not target.startswith("/"), f"COPY outside WORKDIR: {rest}"
        base = dest / target
        for src in sources:
            matched = [f for f in keep if f == src or f.startswith(src.rstrip("/") + "/")]
            assert matched, f"COPY {src}: nothing of it is in the build context (.dockerignore?)"
            for f in matched:
                if f == src:
                    out = base / Path(f).name if (target.endswith("/") or len(sources) > 1) else base
                else:
                    out = base / Path(f).relative_to(src)
                out.parent.mkdir(parents=True, exist_ok=True)
                if (root / f).is_symlink():
                    os.symlink(os.readlink(root / f), out)
                else:
                    shutil.copyfile(root / f, out)
