"""Dependencies point down: pipeline/ (the library) never imports actors/ (the execution
layer) or jobs/ (the command line), actors/ never imports jobs/, and no module of
pipeline/ is part of an import cycle. Imports inside functions count too: a lazy import is
still a dependency. Read from the source text, so a cycle fails here even where Python's
import order happens to tolerate it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

LAYERS = ("pipeline", "actors", "jobs")


def _modules() -> dict[str, Path]:
    mods = {}
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Project modules ``name`` imports: for ``from a.b import c``, ``a.b.c`` where that is
    a module, else ``a.b``."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in mods and t != name}
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def test_layers_only_import_downwards(graph):
    bad = [f"{m} imports {t}" for m, targets in graph.items() for t in targets
           if LAYERS.index(t.split(".")[0]) > LAYERS.index(m.split(".")[0])]
    assert not bad, bad


def test_pipeline_has_no_import_cycle(graph):
    lib = {m: {t for t in ts if t.startswith("pipeline")} for m, ts in graph.items() if m.startswith("pipeline")}
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for t in sorted(lib[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(lib):
        if m not in state:
            visit(m)


def test_the_check_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: a planted cycle and a planted upward import are found."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "actors").mkdir()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "pipeline" / "a.py").write_text("def f():\n    from pipeline import b\n")
    (tmp_path / "pipeline" / "b.py").write_text("from pipeline.a import f\nimport actors.x\n")
    (tmp_path / "actors" / "x.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    mods = _modules()
    g = {name: _imports(name, path, mods) for name, path in mods.items()}
    with pytest.raises(AssertionError, match="import cycle"):
        test_pipeline_has_no_import_cycle(g)
    with pytest.raises(AssertionError, match="pipeline.b imports actors.x"):
        test_layers_only_import_downwards(g)
