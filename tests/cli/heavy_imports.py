"""A watch on the libraries the router never uses (torch, transformers, safetensors): which of
the project's lines imported one first, so a test that says "torch got in" also says how.

`python -m tests.cli.heavy_imports RECORD ARGS...` runs `junction ARGS...` under the watch,
appending each first import's chain to the file RECORD as it happens (a process killed
afterwards has already said it).
"""

from __future__ import annotations

import importlib.abc
import json
import runpy
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "safetensors")


def project_chain() -> list[str]:
    """The project's frames on the stack now, outermost first, as `path:line  code`."""
    chain = []
    for frame in traceback.extract_stack():
        path = Path(frame.filename)
        if not path.is_relative_to(ROOT) or ".venv" in path.parts or path == Path(__file__):
            continue
        chain.append(f"{path.relative_to(ROOT)}:{frame.lineno}  {frame.line}")
    return chain


class HeavyImportWatch(importlib.abc.MetaPathFinder):
    """A finder that finds nothing: it only notes the chain that first asked for each heavy
    library, then lets the real finders import it as always."""

    def __init__(self, record: Path | None = None) -> None:
        self.chains: dict[str, list[str]] = {}  # by library
        self.record = record

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 - the finder protocol
        top = name.partition(".")[0]
        if top in HEAVY and top not in self.chains and top not in sys.modules:
            self.chains[top] = project_chain()
            if self.record is not None:
                with self.record.open("a") as file:
                    file.write(json.dumps({top: self.chains[top]}) + "\n")
        return None


def watch(record: Path | None = None) -> HeavyImportWatch:
    """A watch installed first on `sys.meta_path`; it sees only imports from now on."""
    found = HeavyImportWatch(record)
    sys.meta_path.insert(0, found)
    return found


def read_record(record: Path) -> dict[str, list[str]]:
    """The chains a watched process appended to `record` (none when it holds nothing)."""
    if not record.exists():
        return {}
    chains: dict[str, list[str]] = {}
    for line in record.read_text().splitlines():
        chains.update(json.loads(line))
    return chains


def describe(chains: dict[str, list[str]]) -> str:
    """Each library and the chain of project lines that imported it, for a failed assert."""
    return "\n".join(
        f"{library} imported by:\n    " + "\n    ".join(chain or ["(no project frame)"])
        for library, chain in chains.items()
    )


if __name__ == "__main__":
    watch(Path(sys.argv[1]))
    sys.argv = ["junction", *sys.argv[2:]]
    runpy.run_module("cli.main", run_name="__main__", alter_sys=True)
