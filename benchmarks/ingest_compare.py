"""`benchmarks/ingest.py` for two trees in one run: another tree (before a change), then this one.

Each tree's own `benchmarks/ingest.py` runs in a process of its own, with that tree first on
`PYTHONPATH` and its own `junction api` as the server (`python -m cli.main api`, or
`engine.cli` in a tree from before `cli/`); the figures of both are printed together at the
end, before first. Arguments after `--` go to both runs.

    git worktree add --detach /tmp/junction-before <commit>
    .venv/bin/python benchmarks/ingest_compare.py /tmp/junction-before [-- --quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent.parent
FIGURES = ("junction api", "throughput", "lag at", "breakdown", "  ", "!!")
FIGURES += ("through the balancer", "replicas behind", "| ", "p99 lag", "ceiling")


def run_tree(tree: Path, args: list[str]) -> list[str]:
    """The tree's ingest benchmark, its output echoed; returns the lines with figures."""
    env = os.environ | {"PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, __file__, "--run-in", str(tree), "--", *args]
    print(f"==== {tree}", flush=True)
    process = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
    lines = []
    for line in process.stdout:
        print(line, end="", flush=True)
        if line.startswith(FIGURES):
            lines.append(line.rstrip())
    if process.wait() != 0:
        sys.exit(f"the ingest benchmark failed in {tree} (exit {process.returncode})")
    return lines


def run_in(tree: Path, args: list[str]) -> None:
    """In the tree's process: its `benchmarks/ingest.py`, serving with that tree's CLI."""
    spec = importlib.util.spec_from_file_location("ingest", tree / "benchmarks" / "ingest.py")
    ingest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ingest)
    cli = "cli.main" if (tree / "cli" / "main.py").exists() else "engine.cli"
    original = ingest.subprocess.Popen

    def popen(command, *rest, **kwargs):  # `junction api ...` -> this tree's CLI
        if Path(command[0]).name == "junction":
            command = [sys.executable, "-m", cli, *command[1:]]
        return original(command, *rest, **kwargs)

    ingest.subprocess = SimpleNamespace(**{**vars(subprocess), "Popen": popen})
    sys.argv = ["ingest.py", *args]
    ingest.main()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--run-in":
        run_in(Path(sys.argv[2]), sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path, help="the other tree (a git worktree)")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then ingest.py's options")
    args = parser.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    results = {tree: run_tree(tree, rest) for tree in (args.before.resolve(), HERE)}
    for tree, lines in results.items():
        print(f"\n==== {'before' if tree != HERE else 'after'}: {tree}")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
