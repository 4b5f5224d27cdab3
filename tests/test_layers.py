"""Layers point one way: pipelines -> assets -> ops -> core -> resources, training_runtime alone.

Every import of the project's own packages, anywhere in a file (deferred imports included), must
point at the same layer or one below; and no modules import each other in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Highest first. training_runtime runs in the pods on its own: it imports none of the others.
LAYERS = ["pipelines", "assets", "ops", "core", "resources", "training_runtime"]
RANK = {name: i for i, name in enumerate(LAYERS)}


def project_modules() -> dict[str, Path]:
    found = {}
    for layer in LAYERS:
        for path in (REPO / layer).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules ``path`` imports (``from pkg import mod`` counts as importing pkg.mod)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
            names.update(subs if len(subs) == len(node.names) else [node.module, *subs])
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    out = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def upward_imports(modules: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in sorted(modules.items()):
        mine = name.split(".")[0]
        for target in sorted(imports_of(path, modules)):
            theirs = target.split(".")[0]
            allowed = theirs == mine if mine == "training_runtime" else (
                theirs == "training_runtime" or RANK[theirs] >= RANK[mine])
            if not allowed:
                bad.append(f"{name} imports {target} ({mine} may import only {LAYERS[RANK[mine]:]})")
    return bad


def import_circles(modules: dict[str, Path]) -> list[list[str]]:
    """Groups of modules that reach each other through imports."""
    graph = {m: imports_of(p, modules) - {m} for m, p in modules.items()}
    reach = {m: _reachable(graph, m) for m in graph}
    groups = {tuple(sorted({m} | {o for o in reach[m] if m in reach[o]})) for m in graph if m in reach[m]}
    return sorted(list(g) for g in groups)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_imports_point_down_the_layers():
    assert upward_imports(project_modules()) == []


def test_no_modules_import_each_other():
    assert import_circles(project_modules()) == []


def test_the_checker_finds_an_upward_import_and_a_circle(tmp_path):
    (tmp_path / "a.py").write_text("from pipelines.automation import run_tags\nimport ops.b\n")
    (tmp_path / "b.py").write_text("def deferred():\n    from ops import a\n")
    (tmp_path / "c.py").write_text("")
    modules = {"ops.a": tmp_path / "a.py", "ops.b": tmp_path / "b.py", "pipelines.automation": tmp_path / "c.py"}
    assert upward_imports(modules) == [
        "ops.a imports pipelines.automation (ops may import only "
        "['ops', 'core', 'resources', 'training_runtime'])"]
    assert import_circles(modules) == [["ops.a", "ops.b"]]


# The runtime's own packages, lowest first (training_runtime/README.md says why this order). A module
# may import its own package and those below it; top-level modules count as packages of their own.
RUNTIME_LAYERS = ["atomic_files", "data", "models", "tasks", "config", "distributed", "checkpoint",
                  "observe", "serve", "train", "examples", "__main__"]


def runtime_package(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def upward_runtime_imports(modules: dict[str, Path]) -> list[str]:
    rank = {name: i for i, name in enumerate(RUNTIME_LAYERS)}
    bad = []
    for name, path in sorted(modules.items()):
        if not name.startswith("training_runtime."):
            continue
        mine = runtime_package(name)
        for target in sorted(imports_of(path, modules)):
            theirs = runtime_package(target)
            if theirs == "__init__" or theirs == mine:
                continue
            if mine not in rank or theirs not in rank or rank[theirs] > rank[mine]:
                bad.append(f"{name} imports {target} (training_runtime.{mine} may import only "
                           f"{RUNTIME_LAYERS[:rank.get(mine, -1) + 1]})")
    return bad


def test_runtime_packages_import_downwards():
    assert upward_runtime_imports(project_modules()) == []


def test_every_runtime_module_sits_in_a_known_package():
    unknown = sorted(name for name in project_modules() if name.startswith("training_runtime.")
                     and runtime_package(name) not in RUNTIME_LAYERS)
    assert unknown == [], f"{unknown}: put them in a package of RUNTIME_LAYERS (or add a package there)"


def test_the_runtime_checker_finds_an_upward_import(tmp_path):
    (tmp_path / "a.py").write_text("from training_runtime.train.context import TrainingContext\n")
    (tmp_path / "b.py").write_text("")
    modules = {"training_runtime.data.a": tmp_path / "a.py", "training_runtime.train.context": tmp_path / "b.py"}
    assert upward_runtime_imports(modules) == [
        "training_runtime.data.a imports training_runtime.train.context (training_runtime.data may import only "
        "['atomic_files', 'data'])"]


def test_team_code_imports_only_the_public_api():
    """A team's location (teams/) uses pipelines.api, never the platform's internals."""
    modules = project_modules()
    platform = set(LAYERS)
    for path in (REPO / "teams").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        internal = sorted(m for m in imported if m.split(".")[0] in platform and m != "pipelines.api")
        assert internal == [], f"{path.relative_to(REPO)} imports {internal}; import them from pipelines.api"
    assert "pipelines.api" in modules
