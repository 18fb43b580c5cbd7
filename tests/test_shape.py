"""The shape of the tree that keeps it readable in an hour (STYLE.md, "As the tree grows"):
short functions, small files, and folders of `api/` with one owner each. Each check has a
made-up case that breaks it."""

from __future__ import annotations

import ast
import statistics
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "engine",
    "protocol",
    "bench",
    "whatif",
    "sharedstore",
    "client",
    "publish",
    "serve",
    "attach",
    "api",
    "router",
    "jobs",
    "dashboard",
    "stack",
    "cli",
)
#: The packages whose median file is held short. The engine's faces (`protocol/` to `attach/`)
#: counted in the engine's median until they left it; on their own, a few modules each, their
#: medians are still long (publish 208 lines, whatif 168, bench 151, attach 137).
MEDIAN_PACKAGES = ("engine", "client", "api", "router", "jobs", "dashboard", "stack", "cli")
READ = (*PACKAGES, "benchmarks", "tests")
MAX_FUNCTION_LINES = 80
MAX_MEDIAN_FILE_LINES = 110
MAX_MODULES_PER_FOLDER = 15


def python_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def long_functions(paths: list[Path], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`path:line name (N lines)` of every function longer than `limit` lines."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                num_lines = node.end_lineno - node.lineno + 1
                if num_lines > limit:
                    found.append(f"{path}:{node.lineno} {node.name} ({num_lines} lines)")
    return found


def median_lines(paths: list[Path]) -> float:
    return statistics.median(len(path.read_text(encoding="utf-8").splitlines()) for path in paths)


def crowded_folders(root: Path, limit: int = MAX_MODULES_PER_FOLDER) -> dict[str, int]:
    """The folders under `root` with more than `limit` modules, `__init__.py` included."""
    counts = Counter(str(path.parent.relative_to(root.parent)) for path in python_files(root))
    return {folder: count for folder, count in counts.items() if count > limit}


def test_no_function_is_over_80_lines() -> None:
    paths = [path for folder in READ for path in python_files(ROOT / folder)]
    assert len(paths) > 400, "the walk missed the tree"
    assert long_functions(paths) == [], "split these into named steps"


def test_the_median_file_of_each_package_is_short() -> None:
    medians = {package: median_lines(python_files(ROOT / package)) for package in MEDIAN_PACKAGES}
    over = {package: m for package, m in medians.items() if m > MAX_MEDIAN_FILE_LINES}
    assert over == {}, f"one concept a file: these packages' median file is long: {over}"


def test_no_folder_of_a_package_holds_more_than_15_modules() -> None:
    crowded = {
        folder: count
        for package in PACKAGES
        for folder, count in crowded_folders(ROOT / package).items()
    }
    assert crowded == {}, "give each owner in the folder a subpackage"


def test_the_engine_is_under_15000_lines() -> None:
    paths = python_files(ROOT / "engine")
    num_lines = sum(len(path.read_text(encoding="utf-8").splitlines()) for path in paths)
    assert num_lines < 15_000, f"engine/ holds {num_lines} lines: the core alone, faces above it"


def test_each_check_sees_a_break(tmp_path: Path) -> None:
    long = tmp_path / "api" / "long.py"
    long.parent.mkdir()
    long.write_text("def f():\n" + "    x = 1\n" * 81)
    assert long_functions([long]) == [f"{long}:1 f (82 lines)"]
    assert long_functions([long], limit=82) == []
    for i in range(15):
        (tmp_path / "api" / f"m{i}.py").write_text("x = 1\n")
    assert crowded_folders(tmp_path / "api") == {"api": 16}
    assert median_lines(python_files(tmp_path / "api")) == 1
