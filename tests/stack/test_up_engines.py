"""`junction up --engines N`: N >= 2 engines on the ports after --engine-port, each its own
engine id, all streaming to the control plane, and `junction route` over them on --engine-port,
so the OpenAI URL stays the same; one engine (the default) runs as before, no router. A bad N,
an --engine-id that would name them all, and a taken engine port are refused before anything
starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from stack.parts import Ports, plan
from stack.preflight import check_serve_args, serve_model
from tests.api.processes import free_port
from tests.polling import wait_for
from tests.stack.test_up import Up, is_alive

PORTS = Ports(8080, 8000, 8501)


def option(argv: list[str], name: str) -> list[str]:
    """Every value of `name` in `argv`."""
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == name]


def test_one_engine_is_the_openai_url_itself_with_no_router():
    parts = plan("127.0.0.1", PORTS, runner="null", with_jobs=False)
    assert [part.name for part in parts] == ["api", "engine", "dashboard"]
    (engine,) = [part for part in parts if part.name == "engine"]
    assert (engine.port, engine.url) == (8000, "http://127.0.0.1:8000/v1")
    assert engine.argv[engine.argv.index("serve") :] == [
        *("serve", "--host", "127.0.0.1", "--port", "8000", "--runner", "null"),
        *("--engine-id", "engine-0", "--control-plane", "http://127.0.0.1:8080"),
    ]


def test_several_engines_stand_behind_a_router_on_the_engine_port():
    serve_args = check_serve_args(["--", "--block-size", "32"])
    parts = plan("127.0.0.1", PORTS, runner="null", serve_args=serve_args, num_engines=3)
    names = [part.name for part in parts]
    assert names[:6] == ["api", "engine-0", "engine-1", "engine-2", "router", "dashboard"]
    engines = [part for part in parts if part.name.startswith("engine-")]
    assert [e.port for e in engines] == [8001, 8002, 8003]
    for i, engine in enumerate(engines):
        assert option(engine.argv, "--engine-id") == [f"engine-{i}"]
        assert option(engine.argv, "--control-plane") == ["http://127.0.0.1:8080"]
        assert engine.argv[-2:] == ["--block-size", "32"]  # the same engine options, last
    (router,) = [part for part in parts if part.name == "router"]
    assert router.port == 8000 and option(router.argv, "--port") == ["8000"]
    assert option(router.argv, "--engine") == [f"http://127.0.0.1:{p}" for p in (8001, 8002, 8003)]
    assert option(router.argv, "--model") == []  # the built-in model's tokenizer
    assert router.url == "http://127.0.0.1:8000/v1"
    assert router.ready_url == "http://127.0.0.1:8000/health"
    assert "--token" not in router.argv  # it reads JUNCTION_API_TOKEN, as every part does


def test_the_router_reads_the_engines_checkpoint():
    assert serve_model(()) is None
    assert serve_model(("--block-size", "32")) is None
    assert serve_model(("--model", "/m/a", "--model=/m/b")) == "/m/b"  # the last one wins
    parts = plan("127.0.0.1", PORTS, num_engines=2, model="/m/b")
    (router,) = [part for part in parts if part.name == "router"]
    assert option(router.argv, "--model") == ["/m/b"]


def refused(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "up", "--api-port", str(free_port()), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "started" not in done.stdout and not (tmp_path / "junction.db").exists()
    return done


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engines", "0"], "--engines must be 1 to 16, got 0"),
        (["--engines", "17"], "--engines must be 1 to 16, got 17"),
        (["--engines", "2", "--engine-id", "e"], "engine-0 ... engine-1"),
        (["--engines", "4", "--engine-port", "65533"], "no room for 4 engines"),
    ],
)
def test_a_bad_number_of_engines_is_refused(tmp_path: Path, args: list[str], message: str):
    assert message in refused(tmp_path, *args).stderr


def test_every_engine_port_is_checked_before_anything_starts(tmp_path: Path):
    port = engine_port(2)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port + 2))
        holder.listen()
        done = refused(tmp_path, "--engines", "2", "--engine-port", str(port))
    assert f"port {port + 2} (engine-1)" in done.stderr


def engine_port(num_engines: int) -> int:
    """A free port with the `num_engines` ports after it free too."""
    for _ in range(50):
        port = free_port()
        try:
            for after in range(1, num_engines + 1):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + after))
        except OSError:
            continue
        return port
    raise AssertionError("no run of free ports")


def test_junction_up_routes_over_two_engines(tmp_path: Path):
    port, api_port = engine_port(2), free_port()
    api = f"http://127.0.0.1:{api_port}"
    up = Up(
        tmp_path,
        *("--engines", "2", "--runner", "null", "--no-jobs", "--engine-port", str(port)),
        *("--api-port", str(api_port), "--dashboard-port", str(free_port())),
    )
    try:
        up.wait_for_line("URLs", lambda line: line == "Junction is up:", 120)
        assert set(up.pids()) == {"api", "engine-0", "engine-1", "router", "dashboard"}
        for name, url_port in (("router", port), ("engine-0", port + 1), ("engine-1", port + 2)):
            assert f"  {name:<10} http://127.0.0.1:{url_port}/v1" in up.log
        token = (tmp_path / "junction-api-token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}

        def fleet() -> list[tuple[str, str]]:
            response = httpx.get(f"http://127.0.0.1:{port}/fleet", headers=auth)
            assert response.status_code == 200, response.text
            return sorted((e["engine_id"], e["status"]) for e in response.json()["engines"])

        wait_for(
            "both engines up in the router",
            lambda: fleet() == [("engine-0", "up"), ("engine-1", "up")],
            20,
        )
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(
            model="junction-hybrid-tiny",
            messages=[{"role": "user", "content": "Hello!"}],
            max_tokens=2,
        )
        assert reply.usage.completion_tokens >= 1
        routed = httpx.get(f"http://127.0.0.1:{port}/fleet", headers=auth).json()["num_routed"]
        assert routed == 1

        def connected() -> list[str]:
            engines = httpx.get(f"{api}/api/v1/engines", headers=auth).json()
            return sorted(e["engine_id"] for e in engines if e["connected"])

        # both stream to the control plane
        wait_for("both engines' hellos", lambda: connected() == ["engine-0", "engine-1"], 20)
    finally:
        pids = up.pids()
        code = up.interrupt()
    assert code == 0, up.log[-4000:]
    deadline = time.monotonic() + 10
    while any(is_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, pid in pids.items() if is_alive(pid)], up.log[-4000:]


def test_several_engines_share_units_through_a_directory_unless_a_store_is_named(tmp_path):
    from stack.parts import SHARED_DIR, shared_cache_url

    database = f"sqlite:///{tmp_path}/junction.db"
    url = shared_cache_url(3, (), database, {})
    assert url == str(tmp_path / SHARED_DIR)
    parts = plan("127.0.0.1", PORTS, runner="null", num_engines=3, shared_cache=url)
    engines = [part for part in parts if part.name.startswith("engine-")]
    assert all(option(e.argv, "--shared-cache-url") == [url] for e in engines)
    check_serve_args(["--", "--shared-cache-url", url])  # `junction serve` takes it
    # one engine shares with no one; a store the operator names wins
    assert shared_cache_url(1, (), database, {}) is None
    redis_url = "redis://127.0.0.1:6379/3"
    assert shared_cache_url(3, ("--shared-cache-url", redis_url), database, {}) is None
    assert shared_cache_url(3, (f"--shared-cache-url={redis_url}",), database, {}) is None
    assert shared_cache_url(3, (), database, {"JUNCTION_SHARED_CACHE_URL": redis_url}) is None
    assert shared_cache_url(2, (), "postgresql://x/y", {}).endswith(SHARED_DIR)
