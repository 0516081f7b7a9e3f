"""Dependencies point down: pipeline/ (the library) never imports actors/ (the execution
layer) or jobs/ (the command line), actors/ never imports jobs/, and no module of
any layer is part of an import cycle. The lab (pipeline/training/: training, corpus
generation, losses, model cards, benchmark references; jobs/bench/) is fenced off: nothing
a job runs reaches it. Imports inside functions count too: a lazy import is still a
dependency. Read from the source text, so a cycle fails here even where Python's import
order happens to tolerate it."""
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
            name = ".".join(("shardscribe", *path.relative_to(ROOT).with_suffix("").parts))
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


def _named(path: Path, mods: dict[str, Path]) -> set[str]:
    """Project modules a string constant of ``path`` names as ``"module"`` or
    ``"module:attribute"``: what the registries (decoder kinds, model families) import by
    name when a config asks for them."""
    return {node.value.partition(":")[0] for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.partition(":")[0] in mods}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


# The job's runtime: its commands (cli.py registers the others by importing every jobs
# module, and they import their work lazily, inside ``run``), the execution layer, and every
# module of the registered decoder kinds and model families.
RUNTIME_JOBS = ("transcribe", "pseudo_label", "validate", "report", "build_lm", "build_token_map",
                "calibrate", "cli")
RUNTIME_PACKAGES = ("shardscribe.actors", "shardscribe.pipeline.kinds", "shardscribe.pipeline.models")
LAB = ("shardscribe.pipeline.training", "shardscribe.jobs.bench")


def _runtime_path(mods: dict[str, Path]) -> dict[str, str]:
    """Every module the runtime reaches, each with the module it was first reached from
    (an entry module: itself). A module is reached through its imports (lazy ones too),
    the packages above it (importing ``a.b.c`` runs ``a`` and ``a.b``) and the modules its
    strings name for a registry."""
    entries = [f"shardscribe.jobs.{name}" for name in RUNTIME_JOBS]
    missing = [m for m in entries if m not in mods]
    assert not missing, f"runtime entry modules not found: {missing}"
    entries += [m for m in mods for pkg in RUNTIME_PACKAGES if m == pkg or m.startswith(pkg + ".")]
    edges = {name: _imports(name, path, mods) | _named(path, mods) for name, path in mods.items()}
    reached = {m: m for m in entries}
    todo = list(entries)
    while todo:
        m = todo.pop()
        parts = m.split(".")
        for t in edges[m] | {".".join(parts[:i]) for i in range(1, len(parts))}:
            if t in mods and t not in reached:
                reached[t] = m
                todo.append(t)
    return reached


def test_the_runtime_never_imports_the_lab():
    """No module a job runs imports pipeline.training or jobs.bench, directly, lazily or
    through a registry's module name."""
    mods = _modules()
    reached = _runtime_path(mods)

    def chain(m):
        out = [m]
        while reached[out[-1]] != out[-1]:
            out.append(reached[out[-1]])
        return " <- ".join(out)

    bad = [chain(m) for m in sorted(reached) if any(m == lab or m.startswith(lab + ".") for lab in LAB)]
    assert not bad, "the runtime reaches the lab: " + "; ".join(bad)


def test_layers_only_import_downwards(graph):
    bad = [f"{m} imports {t}" for m, targets in graph.items() for t in targets
           if LAYERS.index(t.split(".")[1]) > LAYERS.index(m.split(".")[1])]
    assert not bad, bad


def test_no_module_is_in_an_import_cycle(graph):
    lib = {m: {t for t in ts if t in graph} for m, ts in graph.items()}
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
    (tmp_path / "pipeline" / "a.py").write_text("def f():\n    from shardscribe.pipeline import b\n")
    (tmp_path / "pipeline" / "b.py").write_text("from shardscribe.pipeline.a import f\nimport shardscribe.actors.x\n")
    (tmp_path / "actors" / "x.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    mods = _modules()
    g = {name: _imports(name, path, mods) for name, path in mods.items()}
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_module_is_in_an_import_cycle(g)
    with pytest.raises(AssertionError, match="shardscribe.pipeline.b imports shardscribe.actors.x"):
        test_layers_only_import_downwards(g)


def test_the_check_sees_the_runtime_reach_the_lab(tmp_path, monkeypatch):
    """The fence can fail: a runtime command's lazy import that leads to pipeline.training,
    and a registry string naming a lab module, are both found."""
    for d in ("pipeline/training", "pipeline/kinds", "pipeline/models", "actors", "jobs"):
        (tmp_path / d).mkdir(parents=True)
    for name in RUNTIME_JOBS:
        (tmp_path / "jobs" / f"{name}.py").write_text("")
    (tmp_path / "pipeline" / "training" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "training" / "corpus.py").write_text("")
    (tmp_path / "pipeline" / "helpers.py").write_text("from shardscribe.pipeline.training.corpus import x\n")
    (tmp_path / "jobs" / "calibrate.py").write_text("def run():\n    from shardscribe.pipeline import helpers\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="shardscribe.pipeline.training.corpus <- shardscribe.pipeline.helpers <- shardscribe.jobs.calibrate"):
        test_the_runtime_never_imports_the_lab()
    (tmp_path / "jobs" / "calibrate.py").write_text("")
    test_the_runtime_never_imports_the_lab()
    (tmp_path / "pipeline" / "kinds" / "registry.py").write_text('KIND = "shardscribe.pipeline.training.corpus:build"\n')
    with pytest.raises(AssertionError, match="shardscribe.pipeline.training.corpus <- shardscribe.pipeline.kinds.registry"):
        test_the_runtime_never_imports_the_lab()


def _bare_layer_imports(path: Path) -> list[str]:
    """The imports of ``path`` that name a layer as a top-level package (``from pipeline.x``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else []
        out += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in LAYERS]
    return out


def test_the_layers_are_imported_through_the_one_package():
    """Code, tests and scripts import ``shardscribe.pipeline`` (.actors, .jobs; the package's
    own modules relatively), never ``pipeline`` itself: an installed wheel has no top-level
    ``pipeline``, and one module imported under two names would hold two registries."""
    files = [ROOT / "__init__.py"] + [p for d in (*LAYERS, "tests", "scripts") for p in sorted((ROOT / d).rglob("*.py"))]
    bad = [hit for path in files for hit in _bare_layer_imports(path)]
    assert not bad, bad


def test_the_bare_import_check_can_fail(tmp_path, monkeypatch):
    (tmp_path / "x.py").write_text("def f():\n    from pipeline.config import JobConfig\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _bare_layer_imports(tmp_path / "x.py") == ["x.py:2 pipeline.config"]
