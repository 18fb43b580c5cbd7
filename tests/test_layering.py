"""The packages depend one way, bottom to top:

    engine (the core) < engine.server, engine.bench (its faces) < api, router < jobs
    < dashboard < stack < cli

No package imports one above it (nor a face the other face), the core loads no web,
database or dashboard library, and no project files import each other in a circle.

Two checks of the layers: one imports every module of a package in a fresh interpreter and
looks at `sys.modules` (what an import really loads); one reads every file's import
statements, those inside functions too (what a command loads only when it runs).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Bottom to top: a package may import the tiers below its own; neither face imports the other.
TIERS = (
    ("engine",),
    ("client",),
    ("engine.server", "engine.bench"),
    ("api", "router"),
    ("jobs",),
    ("dashboard",),
    ("stack",),
    ("cli",),
)
PACKAGES = tuple(package for tier in TIERS for package in tier)
TOP_FOLDERS = ("engine", "client", "api", "router", "jobs", "dashboard", "stack", "cli")
FACES = ("engine.server", "engine.bench")
#: Modules not imported by the walk: `dashboard/app.py` is the Streamlit script `junction
#: dashboard` runs, and importing it runs the navigation outside Streamlit (the pages under
#: `dashboard/pages/` are scripts too, in no package, so the walk never meets them). Both
#: are still read by the import-statement checks below.
NOT_IMPORTED = ("dashboard.app",)
#: What the engine's core must never load: web, database, broker and dashboard libraries.
CORE_FORBIDDEN_LIBRARIES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "psycopg2",
    "asyncpg",
    "streamlit",
    "plotly",
    "celery",
    "kombu",
    "httpx",
    "websockets",
    "redis",
)


def is_in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def package_of(module: str) -> str:
    """The layer a project module belongs to: a face of the engine, else its top package."""
    return next((face for face in FACES if is_in(module, face)), module.split(".")[0])


def above(package: str) -> tuple[str, ...]:
    """The packages `package` must not import: every tier above its own, and its peers."""
    tier = next(i for i, members in enumerate(TIERS) if package in members)
    peers = tuple(p for p in TIERS[tier] if p != package)
    return peers + tuple(p for members in TIERS[tier + 1 :] for p in members)


# ---------------------------------------------------------------------------- import walks
WALK = """
import importlib, json, pkgutil, sys

package, skip = sys.argv[1], tuple(json.loads(sys.argv[2]))
importers = {}


class Importers:
    \"\"\"Notes which module's code asked for each module first (never finds one itself).\"\"\"

    def find_spec(self, name, path=None, target=None):
        frame = sys._getframe(1)
        while frame and frame.f_code.co_filename.startswith(("<frozen", importlib.__file__)):
            frame = frame.f_back
        importers.setdefault(name, frame.f_globals.get("__name__") if frame else None)


sys.meta_path.insert(0, Importers())


def walk(name):
    yield name
    module = sys.modules.get(name) or importlib.import_module(name)
    for info in pkgutil.iter_modules(getattr(module, "__path__", ()), name + "."):
        if not info.name.startswith(skip):
            yield from walk(info.name) if info.ispkg else [info.name]


loaded = {}
for name in walk(package):
    before = set(sys.modules)
    importlib.import_module(name)
    loaded[name] = [[new, importers.get(new)] for new in sorted(set(sys.modules) - before)]
print(json.dumps(loaded))
"""


class Loaded(NamedTuple):
    """A module an import walk loaded."""

    walked: str  # the module the walk imported
    name: str  # a module that import loaded, for the first time
    importer: str | None  # the module whose import statement asked for it

    def __repr__(self) -> str:
        return f"{self.importer} imports {self.name} (loaded by importing {self.walked})"


@cache
def import_walk(package: str) -> tuple[Loaded, ...]:
    """Each module of `package` (its faces left out for the core), imported in turn in a fresh
    interpreter, and what each import loaded. (`pkgutil.iter_modules` package by package, as
    `pkgutil.walk_packages` does, but without importing the packages it skips.)"""
    skip = [*NOT_IMPORTED, *(FACES if package == "engine" else ())]
    done = subprocess.run(
        [sys.executable, "-c", WALK, package, json.dumps(skip)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, f"importing every module of {package} failed:\n{done.stderr}"
    walked = json.loads(done.stdout.strip().splitlines()[-1])
    return tuple(
        Loaded(module, name, importer)
        for module, names in walked.items()
        for name, importer in names
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_a_package_loads_none_above_it(package: str) -> None:
    loaded = import_walk(package)
    assert any(item.name == package for item in loaded), f"the walk missed {package}"
    wrong = [item for item in loaded if any(is_in(item.name, p) for p in above(package))]
    assert not wrong, f"{package} must not import {', '.join(above(package))}:\n" + "\n".join(
        map(repr, wrong)
    )


def test_the_engine_core_loads_no_web_database_or_dashboard_library() -> None:
    wrong = [item for item in import_walk("engine") if item.name in CORE_FORBIDDEN_LIBRARIES]
    assert not wrong, "the engine's core must stay free of these libraries:\n" + "\n".join(
        map(repr, wrong)
    )


# ---------------------------------------------------------------------------- import statements
class Import(NamedTuple):
    """One import statement of a project file that names another project file."""

    source: str  # the module holding the statement
    target: str  # the project module it imports
    line: int

    def __repr__(self) -> str:
        return f"{self.source} (line {self.line}) imports {self.target}"


def project_modules() -> dict[str, Path]:
    """Every .py file of the project's packages, by module name (`dashboard.pages.overview` for
    a page script, though no package holds it)."""
    modules = {}
    for folder in TOP_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(module: str, is_package: bool, nodes: list[ast.AST]):
    """(name, line) of every import in `nodes`, at module level or in a function, except those
    under `if TYPE_CHECKING:` (annotations only: they never run)."""
    for node in nodes:
        if isinstance(node, ast.If) and is_type_checking(node):
            yield from imported_names(module, is_package, node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package holding this module
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno  # a submodule, or a name in `base`
        yield from imported_names(module, is_package, list(ast.iter_child_nodes(node)))


@cache
def project_imports() -> tuple[Import, ...]:
    modules = project_modules()
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, line in imported_names(module, path.name == "__init__.py", tree.body):
            while name and name not in modules:  # `engine.config.CacheConfig` -> engine.config
                name = name.rpartition(".")[0]
            if name and name != module:
                found.append(Import(module, name, line))
    return tuple(found)


def test_no_file_imports_a_package_above() -> None:
    wrong = [
        edge
        for edge in project_imports()
        if package_of(edge.target) in above(package_of(edge.source))
    ]
    assert not wrong, "imports of a package above:\n" + "\n".join(map(repr, wrong))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
    return found


def test_no_files_import_each_other_in_a_circle() -> None:
    graph: dict[str, set[str]] = {module: set() for module in project_modules()}
    for edge in project_imports():
        graph[edge.source].add(edge.target)
    found = circles(graph)
    described = []
    for members in found:
        inside = [e for e in project_imports() if e.source in members and e.target in members]
        described.append(f"{' <-> '.join(members)}:\n  " + "\n  ".join(map(repr, inside)))
    assert not found, (
        "files that import each other (a type-only import goes under `if TYPE_CHECKING:`):\n"
        + "\n".join(described)
    )


def test_the_checks_see_a_circle_and_an_upward_import() -> None:
    """The checks can fail: a made-up circle is found, and the walk sees an upward import."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert "api" in above("engine.server") and "engine.bench" in above("engine.server")
    assert "engine" not in above("api") and above("cli") == ()
    tree = ast.parse("if TYPE_CHECKING:\n    import api.store.db\nelse:\n    import jobs\n")
    assert [name for name, _ in imported_names("engine.x", False, tree.body)] == ["jobs"]
