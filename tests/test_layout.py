"""The shape of the package: no import cycles between its modules, and the transport (the
engine and the hand-framed gRPC wire) importable without Locust or gevent."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "loadkit"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every loadkit module `name` imports, at any depth of the file (function-level and
    TYPE_CHECKING imports count: they are dependencies too)."""
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for candidate in names:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _package_parent(a: str, b: str) -> bool:
    return a.startswith(b + ".") or b.startswith(a + ".")


@pytest.mark.fast
def test_the_package_has_no_import_cycle() -> None:
    modules = _modules()
    graph = {
        name: {d for d in _imports(name, path, modules) if not _package_parent(name, d)}
        for name, path in modules.items()
    }
    assert "loadkit.run.conductor" in graph and graph["loadkit.run.run"]  # the walk saw imports
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


@pytest.mark.fast
def test_a_cycle_is_found_when_there_is_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_transport_imports_without_locust_or_gevent() -> None:
    code = ("import sys, loadkit.transport.wire, loadkit.transport.call, loadkit.engine.core, "
            "loadkit.transport.timer, loadkit.transport.payloads, loadkit.loads.closed, "
            "loadkit.loads.open_rate; "
            "print(' '.join(m for m in ('locust', 'gevent') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"the transport pulled in: {proc.stdout.strip()}"


# The pipeline, bottom to top: a folder (or top-level module) imports only from its own rank or
# below (docs/architecture.md draws it). Names on one rank never import each other.
ORDER: tuple[tuple[str, ...], ...] = (
    ("errors", "clock"),
    ("exits", "events", "modelconfig"),
    ("scenario",),
    ("plan",),
    ("transport", "record"),
    ("control", "engine"),
    ("loads",),
    ("stats",),
    ("slo",),
    ("search",),
    ("run",),
    ("report",),
    ("locust",),
    ("cli",),
    ("__main__",),
)
RANK = {name: i for i, names in enumerate(ORDER) for name in names}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a room to a room ranked above it, or to a sibling of its own rank."""
    out = []
    for module, deps in sorted(graph.items()):
        here = _room(module)
        if here == "__init__":
            continue
        for dep in sorted(deps):
            there = _room(dep)
            if there in (here, "__init__"):
                continue
            if RANK[there] >= RANK[here]:
                out.append(f"{module} -> {dep} ({here} is below or beside {there})")
    return out


@pytest.mark.fast
def test_folders_import_only_downwards() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    rooms = {_room(m) for m in modules} - {"__init__"}
    assert rooms <= set(RANK), f"give these a place in ORDER: {sorted(rooms - set(RANK))}"
    assert upward(graph) == [], "\n".join(upward(graph))


@pytest.mark.fast
def test_an_upward_import_is_found() -> None:
    graph = {"loadkit.run.run": {"loadkit.locust.local_drive"},
             "loadkit.locust.local_drive": {"loadkit.engine.core"},
             "loadkit.engine.core": set(), "loadkit.control.client": {"loadkit.engine.core"}}
    assert upward(graph) == [
        "loadkit.control.client -> loadkit.engine.core (control is below or beside engine)",
        "loadkit.run.run -> loadkit.locust.local_drive (run is below or beside locust)"]


@pytest.mark.fast
def test_no_function_over_80_lines_and_no_module_over_450() -> None:
    """Long functions grew by a parameter per feature (build_step_result had 14); the limits
    keep each job readable in one screen."""
    long = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if text.count("\n") > 450:
            long.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {size} lines")
    assert long == [], "\n".join(long)


@pytest.mark.fast
def test_no_test_file_imports_another() -> None:
    """Shared helpers live in conftest.py: a test file importing another runs its fixtures and
    ties the two files' order together."""
    names = {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    found = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in names:
                found.append(f"{path.name} imports {node.module}")
            elif isinstance(node, ast.Import):
                found += [f"{path.name} imports {a.name}" for a in node.names if a.name in names]
    assert found == [], found


def _host_members() -> set[str]:
    """The lane interface's public members: engine/host.py's Host attributes, properties and
    methods."""
    tree = ast.parse((PACKAGE / "engine" / "host.py").read_text())
    host = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Host")
    out = set()
    for node in ast.walk(host):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            out.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "self" and isinstance(node.ctx, ast.Store)):
            out.add(node.attr)
    return {m for m in out if not m.startswith("_")}


FRAMING = ("loadkit.engine.core", "loadkit.transport.call", "loadkit.transport.connection",
           "tritonclient")


def _chain(node: ast.AST) -> list[str]:
    """The names of an attribute chain, root first: `engine.streams.goodput` -> [engine,
    streams, goodput] (subscripts looked through)."""
    out: list[str] = []
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        out.append(node.id)
    return out[::-1]


def seam_breaches(sources: dict[str, str], members: set[str]) -> list[str]:
    """Where a load model reaches past the lane interface: an import of the engine's core or
    of the wire's framing (protobuf, gRPC frames), `engine.X` / `self.engine.X` with X not a
    member of Host, a write through the engine (`engine.streams.x = ...`), a read or write of
    the window's fields (it is handed back to the Host's verbs whole), or a payload sliced
    (framing is the transport's encoder's)."""
    out = []
    for name, text in sorted(sources.items()):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom | ast.Import):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
                    a.name for a in node.names]
                out += [f"{name} imports {m}" for m in modules if m.startswith(FRAMING)]
            if isinstance(node, ast.Assign | ast.AugAssign):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    chain = _chain(target)
                    if "engine" in chain[:-1] or "window" in chain[:-1]:
                        out.append(f"{name}:{node.lineno} writes {'.'.join(chain)}")
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                    node.value.id == "payload":
                out.append(f"{name}:{node.lineno} slices a payload")
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "window":
                out.append(f"{name}:{node.lineno} window.{node.attr}")
            is_engine = (isinstance(owner, ast.Name) and owner.id == "engine") or (
                isinstance(owner, ast.Attribute) and owner.attr == "engine")
            if is_engine and node.attr not in members:
                out.append(f"{name}:{node.lineno} engine.{node.attr}")
    return out


@pytest.mark.fast
def test_load_models_use_only_the_lane_interface() -> None:
    """loads/ reaches the engine through engine/host.py alone (what a lane may send, count and
    wait on), so the engine's insides can change under the load models."""
    members = _host_members()
    assert {"send", "count", "gate", "payload", "slot", "release"} <= members, members
    sources = {p.name: p.read_text() for p in (PACKAGE / "loads").glob("*.py")}
    assert seam_breaches(sources, members) == []
    # a load model that reaches into the engine is found, however deep the chain
    assert seam_breaches({"x.py": "from loadkit.engine.core import Engine\n"
                                  "def f(engine):\n    return engine.idle_slots\n"}, members) == [
        "x.py imports loadkit.engine.core", "x.py:3 engine.idle_slots"]
    breaches = seam_breaches({"y.py": (
        "from tritonclient.grpc import service_pb2\n"
        "def f(engine, window, payload):\n"
        "    engine.recorder.window.sent += 1\n"
        "    window.sent += 1\n"
        "    engine.streams.goodput = None\n"
        "    return payload[5:]\n")}, members)
    for found in ("y.py imports tritonclient.grpc", "y.py:3 writes engine.recorder.window.sent",
                  "y.py:3 engine.recorder", "y.py:4 writes window.sent", "y.py:4 window.sent",
                  "y.py:5 writes engine.streams.goodput", "y.py:6 slices a payload"):
        assert found in breaches, (found, breaches)
    # every load kind the scenario accepts has a registered model
    from loadkit.loads.registry import MODELS
    assert set(MODELS) == {"concurrency", "rate", "replay"}


# what of transport/ the engine and the load models may import: the seam (a door, the doors'
# registry, the error a request ends with) and the door-independent payload helpers
SEAM = ("loadkit.transport.door", "loadkit.transport.doors", "loadkit.transport.call",
        "loadkit.transport.payloads", "loadkit.transport.validate", "loadkit.transport.timer")


def door_breaches(sources: dict[str, str]) -> list[str]:
    """Where the engine or a load model reaches past the transport seam (transport/door.py):
    an import of one door's own modules (its framing, its connections, its protobuf)."""
    out = []
    for name, text in sorted(sources.items()):
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom | ast.Import):
                continue
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
                a.name for a in node.names]
            for m in modules:
                if m.split(".")[0] in ("h2", "grpc", "tritonclient") or (
                        m.startswith("loadkit.transport") and m not in SEAM):
                    out.append(f"{name} imports {m}")
    return out


@pytest.mark.fast
def test_the_engine_reaches_the_wire_only_through_the_door() -> None:
    """engine/ and loads/ import no door's own modules: a new door (HTTP, shared memory) is a
    file under transport/ and an entry in transport/doors.py, and the engine does not change."""
    sources = {f"{p.parent.name}/{p.name}": p.read_text()
               for folder in ("engine", "loads") for p in (PACKAGE / folder).glob("*.py")}
    assert door_breaches(sources) == []
    assert door_breaches({"engine/x.py": "from loadkit.transport.connection import Connection\n"
                                         "import h2.events\n"
                                         "from loadkit.transport.door import Door\n"}) == [
        "engine/x.py imports loadkit.transport.connection", "engine/x.py imports h2.events"]
