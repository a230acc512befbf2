"""The installed package's import graph: no cycles, and the arrows point the right way
(neither quarry.services nor quarry.formats imports the client package; formats imports
nothing of the services; the pipeline ships no services code)."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path



def _modules() -> dict[str, Path]:
    """Every quarry.* module of the installed package (generated quarry.v1 excluded) and its file."""
    found: dict[str, Path] = {}
    # quarry's sub-packages live in folders mapped by package-dir: walk each one from its own path.
    roots = ["quarry"] + [f"quarry.{name}" for name in ("formats", "services", "clients", "pipeline")]
    for root in roots:
        package = importlib.import_module(root)
        found[root] = Path(package.__file__ or "")
        for info in pkgutil.walk_packages(package.__path__, f"{root}."):
            if info.name.startswith("quarry.v1") or info.name.split(".")[1] in ("formats", "services", "clients", "pipeline") and root == "quarry":
                continue
            spec = importlib.util.find_spec(info.name)
            assert spec is not None and spec.origin is not None, info.name
            found[info.name] = Path(spec.origin)
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the quarry modules it imports (at any depth of its code: a function-level
    import is still an arrow)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, path.name == "__init__.py", node)
                targets.add(base)
                targets.update(f"{base}.{a.name}" for a in node.names)
        edges = set()
        for t in targets:
            # The module itself, or the package an imported name belongs to.
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name and t != "quarry":
                edges.add(t)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


GRAPH = _imports(_modules())


def test_the_walk_sees_the_whole_package() -> None:
    for name in ("quarry.formats.record", "quarry.services.commitlog.storage.store", "quarry.clients.cli", "quarry.pipeline.jobs", "quarry.channels"):
        assert name in GRAPH
    assert "quarry.formats.record" in GRAPH["quarry.services.commitlog.storage.append"]


def test_no_import_cycle() -> None:
    assert _cycles(GRAPH) == []


def test_a_cycle_would_be_found() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _reaches(start: str, prefix: str) -> list[str]:
    seen, todo, hits = set(), [start], []
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if m.startswith(prefix):
            hits.append(m)
        todo.extend(GRAPH.get(m, ()))
    return hits


def test_no_module_names_another_for_a_dynamic_import_across_the_rule() -> None:
    # importlib.import_module("quarry.clients...") inside services would hide an arrow from the walk.
    for name, path in _modules().items():
        if name.startswith(("quarry.services", "quarry.formats")):
            assert '"quarry.clients' not in path.read_text(), name


def test_services_and_formats_never_import_the_client_package() -> None:
    wrong = {m: sorted(t for t in GRAPH[m] if t.startswith("quarry.clients")) for m in GRAPH
             if m.startswith(("quarry.services", "quarry.formats"))}
    assert {m: t for m, t in wrong.items() if t} == {}


def test_formats_import_nothing_but_formats() -> None:
    wrong = {m: sorted(t for t in GRAPH[m] if not t.startswith("quarry.formats")) for m in GRAPH if m.startswith("quarry.formats")}
    assert {m: t for m, t in wrong.items() if t} == {}


def test_the_pipeline_reaches_no_services_code() -> None:
    # Its executors get quarry.formats and quarry.pipeline only (session.SHIPPED_PACKAGES).
    from quarry.pipeline.session import SHIPPED_PACKAGES

    assert not any(p.startswith("quarry.services") for p in SHIPPED_PACKAGES)
    # The command line (argument parsing shared with the services) runs on the driver only.
    driver_only = ("quarry.pipeline.cli", "quarry.pipeline.__main__")
    task_side = [m for m in GRAPH if m.startswith("quarry.pipeline") and m not in driver_only]
    assert {m: _reaches(m, "quarry.services") for m in task_side if _reaches(m, "quarry.services")} == {}


def test_the_shared_grpc_plumbing_sits_below_services_and_clients() -> None:
    for name in ("quarry.channels", "quarry.signing"):
        assert all(t.startswith(("quarry.formats", "quarry.channels", "quarry.signing")) for t in GRAPH[name]), GRAPH[name]
    users = {m for m, t in GRAPH.items() if "quarry.channels" in t}
    assert any(m.startswith("quarry.services") for m in users) and any(m.startswith("quarry.clients") for m in users)


# The layers of a service (docs/architecture.md): storage <- broker semantics <- doors <- the
# composition root (main.py, config, registration, the ports' start-up). Shared by every layer:
# the service's metrics registry and the services-wide plumbing (log, progress, errors, settings).
COMMITLOG = "quarry.services.commitlog"
STORAGE, BROKER, DOORS = f"{COMMITLOG}.storage", f"{COMMITLOG}.broker", f"{COMMITLOG}.doors"
PROTOCOLS = ("grpc", "quarry.v1", "quarry.services.remoting", "quarry.services.rmq5", "quarry.channels", "asyncio")


def _raw_imports(module: str) -> set[str]:
    """Every name a module imports (third-party and standard library too)."""
    path = _modules()[module]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
    return names


def _layer_of(module: str) -> str:
    for layer in (STORAGE, BROKER, DOORS):
        if module == layer or module.startswith(layer + "."):
            return layer
    return ""


def test_the_layers_exist_and_hold_the_modules() -> None:
    assert {_layer_of(m) for m in GRAPH if m.startswith(COMMITLOG + ".")} >= {STORAGE, BROKER, DOORS}
    assert "quarry.services.commitlog.storage.store" in GRAPH and "quarry.services.commitlog.broker.core" in GRAPH


def test_storage_imports_no_broker_door_or_protocol() -> None:
    storage = [m for m in GRAPH if _layer_of(m) == STORAGE]
    wrong = {m: sorted(t for t in GRAPH[m] if _layer_of(t) in (BROKER, DOORS) or t.startswith(("quarry.v1", "quarry.services.remoting", "quarry.services.rmq5")))
             for m in storage}
    assert {m: t for m, t in wrong.items() if t} == {}
    # plain Python over files: no event loop, no gRPC
    loops = {m: sorted(n for n in _raw_imports(m) if n.split(".")[0] in ("asyncio", "grpc")) for m in storage}
    assert {m: n for m, n in loops.items() if n} == {}


def test_broker_semantics_are_protocol_free() -> None:
    broker = [m for m in GRAPH if _layer_of(m) == BROKER]
    wrong = {m: sorted(t for t in GRAPH[m] if _layer_of(t) == DOORS or t.startswith(("quarry.v1", "quarry.services.remoting", "quarry.services.rmq5")))
             for m in broker}
    assert {m: t for m, t in wrong.items() if t} == {}
    grpc_users = {m for m in broker if any(n.split(".")[0] == "grpc" for n in _raw_imports(m))}
    assert grpc_users == set()


def _door(module: str) -> str:
    """A door is named by its protocol: quarry_v1*, remoting*, rmq5*, nameserver."""
    name = module.rsplit(".", 1)[1]
    return next((p for p in ("quarry_v1", "remoting", "rmq5", "nameserver") if name.startswith(p)), name)


def test_a_door_never_imports_another_door() -> None:
    doors = [m for m in GRAPH if ".doors." in m]
    assert doors, "no doors found"
    wrong = {m: sorted(t for t in GRAPH[m] if ".doors." in t and (_door(t) != _door(m) or t.rsplit(".doors.", 1)[0] != m.rsplit(".doors.", 1)[0]))
             for m in doors}
    assert {m: t for m, t in wrong.items() if t} == {}


def test_only_the_composition_root_reaches_into_the_doors() -> None:
    # storage and broker modules never import a door; other services' modules neither
    users = {m for m, t in GRAPH.items() for d in t if ".doors." in d and ".doors." not in m}
    roots = {m for m in users if m.rsplit(".", 1)[1] in ("main", "__main__", "remoting_port", "server")}
    assert users - roots == set(), sorted(users - roots)
