"""The router never loads torch, transformers or safetensors (issue 50: a restarted router is
back within 2 s, and torch alone took about 1 s of the `junction` command's start). From
`import cli.main` and `junction --help` through the router's own modules, and through a real
`junction route` serving a request, none of them is imported; a failure names the project's
lines that imported it (`tests.cli.heavy_imports`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from tests.api.processes import free_port
from tests.cli.heavy_imports import ROOT, describe, read_record
from tests.polling import wait_for
from tests.router.processes import AUTH, MODEL, TOKEN, Process, child_env, running, start_engine

#: what `junction route` imports once it runs, beyond `cli.main` (router/cli.py's `_serve`)
ROUTER_RUN = """
from engine.model.hf.tokenizer import load_tokenizer
load_tokenizer(None)
import uvicorn
from protocol.connections.guarded import guarded_protocol
from router.app import create_app
from router.discovery import discover, keep_discovering
from router.engines import FleetEngine, follow
from router.fleet import Fleet
from router.readiness import Readiness
"""

JUNCTION = """
import cli.main
cli.main.build_parser().format_help()  # junction --help
"""

WATCHED = """
import json
from tests.cli.heavy_imports import watch
found = watch()
{code}
print(json.dumps(found.chains))
"""


def watched_imports(code: str) -> dict[str, list[str]]:
    """The heavy libraries a fresh interpreter imports running `code`, with their chains."""
    done = subprocess.run(
        [sys.executable, "-c", WATCHED.format(code=code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_junction_command_and_its_help_load_no_heavy_library() -> None:
    chains = watched_imports(JUNCTION)
    assert chains == {}, describe(chains)


def test_the_routers_modules_load_no_heavy_library() -> None:
    chains = watched_imports(JUNCTION + ROUTER_RUN)
    assert chains == {}, describe(chains)


def test_the_watch_names_the_chain_that_imported_torch() -> None:
    """The check above could pass by seeing nothing: here it must see torch come in."""
    chains = watched_imports("import engine.runners.null")
    assert "torch" in chains
    *_, importer = chains["torch"]  # the project's line that asked for it, `path:line  code`
    assert importer.startswith("engine/") and importer.endswith("import torch"), chains


def test_a_router_serving_a_request_loads_no_heavy_library(tmp_path: Path) -> None:
    record = tmp_path / "heavy.jsonl"
    port = free_port()
    engine = start_engine(tmp_path, "e0")
    args = ["route", "--port", str(port), "--log-level", "warning", "--engine", engine.url]
    with (tmp_path / "router.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.cli.heavy_imports", str(record), *args],
            cwd=ROOT,
            env=child_env(JUNCTION_API_TOKEN=TOKEN),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    router = Process("junction route", process, port, tmp_path / "router.log")
    with running(engine, router):
        body = {"model": MODEL, "prompt": "a prompt the router proxies", "max_tokens": 4}
        answer = httpx.post(f"{router.url}/v1/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text

        def ready() -> bool:
            fleet = httpx.get(f"{router.url}/fleet", headers=AUTH, timeout=5).json()
            return fleet["status"] == "ready"

        wait_for("the router's fleet to be ready", ready)
    chains = read_record(record)
    assert chains == {}, describe(chains)
