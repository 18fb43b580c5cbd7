"""The rules of the project's shape (docs/architecture.md, STYLE.md), each a check and each
with a test that breaks it on purpose in a made-up project and sees the check fail.

The packages depend one way, bottom to top:

    engine (the core) < workloads < protocol, bench, whatif < client < publish < serve, attach
    < api, router, dashboard < jobs < stack < cli < benchmarks

1. No package imports one above it, nor a peer of its own tier.
2. The engine's core loads no web, database, broker or dashboard library, and imports no
   other package of the project: only itself, the standard library and its dependencies.
3. No project files import each other in a circle, not even for type hints.
4. The dashboard imports nothing of the project but `client/`.
5. `api/` imports of the engine only the modules `API_MAY_IMPORT` names: the event schema and
   the rules the store must share with the engine.
6. `benchmarks/` imports nothing from `tests/`.

Two ways of seeing an import: one imports every module of a package in a fresh interpreter and
looks at `sys.modules` (what an import really loads, `importlib` included); one reads every
file's import statements, those inside functions too, and `importlib.import_module("...")`
calls with a literal name (what a command loads only when it runs).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
#: Bottom to top: a package may import the tiers below its own, none above, no peer.
TIERS = (
    ("engine",),
    ("workloads",),
    ("protocol", "bench", "whatif", "sharedstore"),
    ("client",),
    ("publish",),
    ("serve", "attach"),
    ("api", "router", "dashboard"),
    ("jobs",),
    ("stack",),
    ("cli",),
    ("benchmarks",),
)
PACKAGES = tuple(package for tier in TIERS for package in tier)
#: Folders read for import statements: the packages, the benchmark scripts and the tests.
FOLDERS = tuple(package for package in PACKAGES if package != "benchmarks")
SCRIPTS = ("benchmarks", "tests")
#: Modules the walk does not import: `dashboard/app.py` is the Streamlit script `junction
#: dashboard` runs, and importing it runs the navigation outside Streamlit (the pages under
#: `dashboard/views/` are scripts, in no package, so the walk never meets them). Both are
#: still read by the import-statement checks.
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
#: The engine modules `api/` may import, and why the store needs each.
API_MAY_IMPORT = {
    "engine.events": "the event schema: what ingest applies",
    "engine.wire": "the frames of the ingest socket",
    "engine.geometry": "the hello's cache geometry",
    "engine.modes": "the cache modes a benchmark run replays",
    "engine.model.tokenizer": "a pin's text to token ids, rendered as the engine renders it",
    "engine.traces.trace": "a pin's segments to token ids, as a trace's lines are read",
}
#: What the dashboard may import of the project: the client, and itself.
DASHBOARD_MAY_IMPORT = ("client", "dashboard")


def is_in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def package_of(module: str) -> str:
    """The layer a project module belongs to: its top package."""
    return module.split(".")[0]


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
    importer: str | None  # the module whose code asked for it

    def __repr__(self) -> str:
        return f"{self.importer} imports {self.name} (loaded by importing {self.walked})"


def import_walk(root: Path, package: str) -> tuple[Loaded, ...]:
    """Each module of `package` under `root`, imported in turn in a fresh interpreter, and what
    each import loaded. (`pkgutil.iter_modules` package by package, as `pkgutil.walk_packages`
    does, but without importing the packages it skips.)"""
    done = subprocess.run(
        [sys.executable, "-c", WALK, package, json.dumps(NOT_IMPORTED)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )
    assert done.returncode == 0, f"importing every module of {package} failed:\n{done.stderr}"
    walked = json.loads(done.stdout.strip().splitlines()[-1])
    return tuple(
        Loaded(module, name, importer)
        for module, names in walked.items()
        for name, importer in names
    )


# ---------------------------------------------------------------------------- import statements
class Import(NamedTuple):
    """One import of a project file that names another project file."""

    source: str  # the module holding the statement
    target: str  # the project module it imports
    line: int
    type_only: bool  # under `if TYPE_CHECKING:`: it never runs

    def __repr__(self) -> str:
        return f"{self.source} (line {self.line}) imports {self.target}"


def project_modules(root: Path) -> dict[str, Path]:
    """Every .py file of the project, by module name (`dashboard.views.overview` for a page
    script and `benchmarks.fleet` for a benchmark, though no package holds them)."""
    modules = {}
    for folder in (*FOLDERS, *SCRIPTS):
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def is_import_module(node: ast.AST) -> bool:
    """`importlib.import_module("x")`, `import_module("x")` or `__import__("x")`, the name a
    literal."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in ("import_module", "__import__") and isinstance(node.args[0].value, str)


def imported_names(module: str, is_package: bool, nodes: list[ast.AST], type_only=False):
    """(name, line, type_only) of every import in `nodes`, at module level or in a function;
    `type_only` for those under `if TYPE_CHECKING:`."""
    for node in nodes:
        if isinstance(node, ast.If) and is_type_checking(node):
            yield from imported_names(module, is_package, node.body, True)
            yield from imported_names(module, is_package, node.orelse, type_only)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, type_only
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package holding this module
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:  # a submodule, or a name in `base`
                yield f"{base}.{alias.name}", node.lineno, type_only
        elif is_import_module(node):
            yield node.args[0].value, node.lineno, type_only
        yield from imported_names(module, is_package, list(ast.iter_child_nodes(node)), type_only)


@cache
def project_imports(root: Path) -> tuple[Import, ...]:
    modules = project_modules(root)
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        names = imported_names(module, path.name == "__init__.py", tree.body)
        for name, line, type_only in names:
            while name and name not in modules:  # `engine.config.CacheConfig` -> engine.config
                name = name.rpartition(".")[0]
            if name and name != module:
                found.append(Import(module, name, line, type_only))
    return tuple(dict.fromkeys(found))  # `from x import a, b` names x once


# ---------------------------------------------------------------------------- the rules
def upward_imports(root: Path) -> list[Import]:
    """Rule 1, read from the statements (type-only ones too: they name a layer all the same)."""
    return [
        edge
        for edge in project_imports(root)
        if package_of(edge.source) in PACKAGES
        and package_of(edge.target) in above(package_of(edge.source))
    ]


def upward_loads(root: Path, package: str) -> list[Loaded]:
    """Rule 1, as importing every module of `package` really loads."""
    return [
        item
        for item in import_walk(root, package)
        if any(is_in(item.name, p) for p in above(package))
    ]


def core_libraries(root: Path) -> list[Loaded]:
    """Rule 2: the libraries."""
    return [item for item in import_walk(root, "engine") if item.name in CORE_FORBIDDEN_LIBRARIES]


def core_imports_beyond_itself(root: Path) -> list[Import]:
    """Rule 2: the project. What the engine imports of the project is the engine (statements
    of every kind, those in functions and `importlib` calls too; the walk sees only what an
    import really loads)."""
    return [
        edge
        for edge in project_imports(root)
        if is_in(edge.source, "engine") and not is_in(edge.target, "engine")
    ]


def installed_with(requirements: list[str]) -> set[str]:
    """The top-level modules the distributions `requirements` name install, with those of the
    distributions they require in turn (their extras left out)."""
    seen: set[str] = set()
    todo = [Requirement(requirement).name for requirement in requirements]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in map(Requirement, requires):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return {
        module
        for module, distributions in metadata.packages_distributions().items()
        if any(canonicalize_name(distribution) in seen for distribution in distributions)
    }


def core_libraries_beyond(root: Path, libraries: set[str]) -> list[Import]:
    """Rule 2: the libraries the statements name. Each import of the engine's core names the
    standard library, the engine, or one of `libraries` (the project's own packages are the
    other check's)."""
    modules = project_modules(root)
    found = []
    for module, path in modules.items():
        if not is_in(module, "engine"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, line, type_only in imported_names(module, path.name == "__init__.py", tree.body):
            top = name.split(".")[0]
            if top in (*sys.stdlib_module_names, *PACKAGES, "__future__") or top in libraries:
                continue
            found.append(Import(module, top, line, type_only))
    return list(dict.fromkeys(found))


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


def import_circles(root: Path) -> list[str]:
    """Rule 3: each circle, with the imports that close it."""
    graph: dict[str, set[str]] = {module: set() for module in project_modules(root)}
    for edge in project_imports(root):
        graph[edge.source].add(edge.target)
    described = []
    for members in circles(graph):
        inside = [e for e in project_imports(root) if e.source in members and e.target in members]
        described.append(f"{' <-> '.join(members)}:\n  " + "\n  ".join(map(repr, inside)))
    return described


def dashboard_imports_beyond_client(root: Path) -> list[Import]:
    """Rule 4."""
    return [
        edge
        for edge in project_imports(root)
        if is_in(edge.source, "dashboard")
        and not any(is_in(edge.target, allowed) for allowed in DASHBOARD_MAY_IMPORT)
    ]


def api_imports_of_engine_internals(root: Path) -> list[Import]:
    """Rule 5."""
    return [
        edge
        for edge in project_imports(root)
        if is_in(edge.source, "api")
        and is_in(edge.target, "engine")
        and not any(is_in(edge.target, allowed) for allowed in API_MAY_IMPORT)
    ]


def benchmarks_imports_of_tests(root: Path) -> list[Import]:
    """Rule 6."""
    return [
        edge
        for edge in project_imports(root)
        if is_in(edge.source, "benchmarks") and is_in(edge.target, "tests")
    ]


def listed(found: list) -> str:
    return "\n".join(map(repr, found))


# ------------------------------------------------------------------------ the project holds them
@pytest.mark.parametrize("package", [p for p in PACKAGES if p != "benchmarks"])
def test_importing_a_package_loads_none_above_it(package: str) -> None:
    loaded = import_walk(ROOT, package)
    assert any(item.name == package for item in loaded), f"the walk missed {package}"
    wrong = upward_loads(ROOT, package)
    assert not wrong, f"{package} must not import {', '.join(above(package))}:\n{listed(wrong)}"


def test_no_file_imports_a_package_above() -> None:
    wrong = upward_imports(ROOT)
    assert not wrong, f"imports of a package above:\n{listed(wrong)}"


def test_the_engine_core_loads_no_web_database_or_dashboard_library() -> None:
    wrong = core_libraries(ROOT)
    assert not wrong, f"the engine's core must stay free of these libraries:\n{listed(wrong)}"


def test_the_engine_core_imports_nothing_of_the_project_but_itself() -> None:
    wrong = core_imports_beyond_itself(ROOT)
    assert not wrong, f"the engine's core imports no other package of the project:\n{listed(wrong)}"


def test_the_engine_core_imports_only_the_libraries_it_depends_on() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wrong = core_libraries_beyond(ROOT, installed_with(dependencies))
    assert not wrong, (
        "the engine's core imports only the standard library and the project's dependencies "
        f"(pyproject.toml's, and what they install):\n{listed(wrong)}"
    )


def test_no_files_import_each_other_in_a_circle() -> None:
    found = import_circles(ROOT)
    assert not found, "files that import each other (even for type hints):\n" + "\n".join(found)


def test_the_dashboard_imports_only_the_client() -> None:
    wrong = dashboard_imports_beyond_client(ROOT)
    assert not wrong, f"the dashboard speaks to the project through client/ only:\n{listed(wrong)}"


def test_the_api_imports_only_the_engine_modules_it_must_share() -> None:
    wrong = api_imports_of_engine_internals(ROOT)
    assert not wrong, (
        "api/ may import of the engine only API_MAY_IMPORT (add a module there with the reason "
        f"the store must share it, or move what it needs into one):\n{listed(wrong)}"
    )


def test_benchmarks_import_nothing_from_the_tests() -> None:
    wrong = benchmarks_imports_of_tests(ROOT)
    assert not wrong, f"benchmarks/ must not import tests/:\n{listed(wrong)}"


def test_every_module_api_may_import_exists() -> None:
    """A stale entry of `API_MAY_IMPORT` would let a future module of that name in unseen."""
    modules = project_modules(ROOT)
    assert [name for name in API_MAY_IMPORT if name not in modules] == []


# ---------------------------------------------------------------------------- each rule can fail
def made_up_project(root: Path, files: dict[str, str]) -> Path:
    """A project of the same packages under `root`, each with an empty `__init__.py` and a
    module `ok`, plus `files` (path: source)."""
    for folder in (*FOLDERS, "tests"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").write_text("")
        (root / folder / "ok.py").write_text("")
    (root / "benchmarks").mkdir(exist_ok=True)
    for path, source in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(source))
    return root


def test_rule_1_sees_an_upward_import_in_a_statement_and_in_the_walk(tmp_path: Path) -> None:
    root = made_up_project(
        tmp_path,
        {
            "engine/core.py": "def run():\n    import api.ok\n",  # only when it runs
            "client/rest.py": "import importlib\nimportlib.import_module('router.ok')\n",
            "serve/app.py": "from attach import ok\n",  # a peer
        },
    )
    assert {(e.source, e.target) for e in upward_imports(root)} == {
        ("engine.core", "api.ok"),
        ("client.rest", "router.ok"),
        ("serve.app", "attach.ok"),
    }
    loaded = upward_loads(root, "client")
    assert {(item.importer, item.name) for item in loaded} == {
        ("client.rest", "router"),
        ("client.rest", "router.ok"),
    }
    assert upward_loads(root, "engine") == []  # `run` never ran: the statements see it


def test_rule_2_sees_a_web_library_in_the_core(tmp_path: Path) -> None:
    root = made_up_project(tmp_path, {"engine/cache.py": "import httpx\n"})
    assert [(item.importer, item.name) for item in core_libraries(root)] == [
        ("engine.cache", "httpx")
    ]


def test_rule_2_sees_the_core_import_another_package_of_the_project(tmp_path: Path) -> None:
    root = made_up_project(
        tmp_path,
        {
            "engine/server.py": "from engine import ok\nimport json\n\n"
            "def serve():\n    from serve import ok\n",  # only when it runs
            "engine/bench.py": "import importlib\n\ndef run():\n"
            "    importlib.import_module('bench.ok')\n",
            "engine/events.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from client.ok import Settings\n",
        },
    )
    assert {(e.source, e.target) for e in core_imports_beyond_itself(root)} == {
        ("engine.server", "serve.ok"),
        ("engine.bench", "bench.ok"),
        ("engine.events", "client.ok"),
    }
    assert upward_loads(root, "engine") == []  # none of them runs on import


def test_rule_2_sees_the_core_import_a_library_it_does_not_depend_on(tmp_path: Path) -> None:
    root = made_up_project(
        tmp_path,
        {
            "engine/hf.py": "import json\nfrom jinja2 import Template\n\n"
            "def read():\n    import yaml\n",  # a test extra, not the engine's
            "api/ok.py": "import yaml\n",
        },
    )
    assert [(e.source, e.target) for e in core_libraries_beyond(root, {"jinja2"})] == [
        ("engine.hf", "yaml")
    ]
    assert "jinja2" in installed_with(["torch"]) and "torch" not in installed_with(["numpy"])


def test_rule_3_sees_a_circle_closed_by_a_type_only_import(tmp_path: Path) -> None:
    root = made_up_project(
        tmp_path,
        {
            "engine/a.py": "from engine import b\n",
            "engine/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from engine.a import A\n",
        },
    )
    found = import_circles(root)
    assert len(found) == 1 and found[0].startswith("engine.a <-> engine.b")
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_rule_4_sees_the_dashboard_reach_past_the_client(tmp_path: Path) -> None:
    root = made_up_project(
        tmp_path,
        {
            "dashboard/pages/home.py": "from client import ok\nfrom engine.ok import x\n",
            "dashboard/figure.py": "from dashboard import ok\nimport api.ok\n",
        },
    )
    assert {(e.source, e.target) for e in dashboard_imports_beyond_client(root)} == {
        ("dashboard.pages.home", "engine.ok"),
        ("dashboard.figure", "api.ok"),
    }


def test_rule_5_sees_the_api_reach_into_an_engine_internal(tmp_path: Path) -> None:
    root = made_up_project(
        tmp_path,
        {
            "engine/events.py": "",
            "engine/scheduler.py": "",
            "api/ingest.py": "from engine.events import X\nfrom engine.scheduler import S\n",
        },
    )
    assert [(e.source, e.target) for e in api_imports_of_engine_internals(root)] == [
        ("api.ingest", "engine.scheduler")
    ]


def test_rule_6_sees_a_benchmark_import_a_test_helper(tmp_path: Path) -> None:
    root = made_up_project(
        tmp_path, {"benchmarks/speed.py": "from tests.ok import helper\nimport engine.ok\n"}
    )
    assert [(e.source, e.target) for e in benchmarks_imports_of_tests(root)] == [
        ("benchmarks.speed", "tests.ok")
    ]
    assert upward_imports(root) == []  # benchmarks sit on top: the engine is theirs to use


def test_the_tiers_say_who_is_above_whom() -> None:
    assert "api" in above("serve") and "attach" in above("serve") and "serve" in above("attach")
    assert "serve" in above("client") and "client" in above("whatif")
    assert "dashboard" in above("api") and "engine" not in above("protocol")
    assert "publish" in above("client") and "publish" not in above("serve")
    assert "engine" not in above("api") and above("benchmarks") == ()


def package_edges(root: Path) -> set[tuple[str, str]]:
    """Which package imports which, as the import statements say."""
    return {
        (package_of(edge.source), package_of(edge.target))
        for edge in project_imports(root)
        if package_of(edge.source) != package_of(edge.target)
        and {package_of(edge.source), package_of(edge.target)} <= set(PACKAGES)
    }


def test_the_architecture_page_draws_the_imports() -> None:
    """docs/architecture.md's picture of the imports is the tree's own: an arrow more or less
    there, and the page says something the code does not."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    diagram = page.split("```mermaid\n", 1)[1].split("```", 1)[0]
    drawn = {
        (source.split("[")[1].rstrip("]"), target.split("[")[1].rstrip("]"))
        for source, _, target in (line.split() for line in diagram.splitlines() if "-->" in line)
    }
    found = package_edges(ROOT)
    assert drawn == found, f"drawn, not found: {drawn - found}; found, not drawn: {found - drawn}"


# ---------------------------------------------------------------------------- api/'s own layers
#: The parts of `api/` (its subpackages and top-level modules), bottom to top: a part may import
#: the layers below its own, none above, no other part of its own layer. (The same order as
#: docs/architecture.md's `api/` row.)
API_LAYERS = (
    ("api.settings", "api.metrics"),  # what the app is told, and what it counts
    ("api.store",),  # the tables, sessions and plain reads and writes over them
    # each concern over the store
    ("api.guards", "api.attribution", "api.peers", "api.runs", "api.fleet"),
    # what builds on several concerns: what-if runs, the frames applied, the REST bodies
    ("api.whatif", "api.ingest", "api.schemas"),
    ("api.state",),  # what the running app holds
    # what runs over the app's state, and the error answers the routes declare
    ("api.deps", "api.membership", "api.retention", "api.openapi"),
    ("api.routes", "api.lifespan"),
    ("api.main",),  # the app
    ("api.cli",),  # `junction api`
)


def api_part(module: str) -> tuple[int, str] | None:
    """(its layer, its part) of a module of `api/`; None for one in no part (`api` itself)."""
    return next(
        (
            (layer, part)
            for layer, parts in enumerate(API_LAYERS)
            for part in parts
            if is_in(module, part)
        ),
        None,
    )


def api_imports_up_or_across(root: Path) -> list[Import]:
    """Every import inside `api/` of a part in a layer above its own, or of another part of its
    own layer (type-only ones and those inside functions too)."""
    found = []
    for edge in project_imports(root):
        source, target = api_part(edge.source), api_part(edge.target)
        if source is not None and target is not None and source[1] != target[1]:
            if target[0] >= source[0]:
                found.append(edge)
    return found


def unplaced_api_parts(root: Path) -> list[str]:
    """The subpackages and top-level modules of `api/` that `API_LAYERS` does not place."""
    parts = sorted(
        f"api.{path.stem}"
        for path in (root / "api").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    )
    return [part for part in parts if api_part(part) is None]


def test_no_part_of_the_api_imports_one_above_it_or_beside_it() -> None:
    wrong = api_imports_up_or_across(ROOT)
    assert not wrong, (
        "api/'s parts import down API_LAYERS only (move what is shared to the lower part):\n"
        f"{listed(wrong)}"
    )


def test_every_part_of_the_api_has_its_layer() -> None:
    """A new subpackage or module of `api/` is checked only once `API_LAYERS` places it."""
    assert unplaced_api_parts(ROOT) == []
    placed = [part for parts in API_LAYERS for part in parts]
    assert len(placed) == len(set(placed))
    gone = [
        part
        for part in placed
        if not (ROOT / f"{part.replace('.', '/')}.py").exists()
        and not (ROOT / part.replace(".", "/") / "__init__.py").exists()
    ]
    assert gone == [], "API_LAYERS places parts api/ no longer has"


def test_the_api_layers_see_an_import_up_or_across(tmp_path: Path) -> None:
    root = made_up_project(
        tmp_path,
        {
            "api/settings.py": "",
            "api/state.py": "from api.settings import Settings\n",  # down: fine
            "api/store/__init__.py": "",
            "api/store/models.py": "from api.routes.pins import router\n",  # up
            "api/peers/__init__.py": "",
            "api/peers/blocks.py": "def apply():\n    from api.state import AppState\n",  # up
            "api/fleet/__init__.py": "",
            "api/fleet/pins.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from api.peers.blocks import apply\n",  # beside, for a type hint only
            "api/routes/__init__.py": "",
            "api/routes/pins.py": "from api.store.models import Pin\nfrom api.routes import ok\n",
            "api/schedule/__init__.py": "",  # a part API_LAYERS does not place
        },
    )
    assert {(e.source, e.target) for e in api_imports_up_or_across(root)} == {
        ("api.store.models", "api.routes.pins"),
        ("api.peers.blocks", "api.state"),
        ("api.fleet.pins", "api.peers.blocks"),
    }
    assert unplaced_api_parts(root) == ["api.ok", "api.schedule"]
