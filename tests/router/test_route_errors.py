"""`junction route` refusing what it cannot do, each time with a clear error and never a 500:
bad command lines exit 2 with one message naming what to fix, bad requests get an OpenAI error
body with a code a client can act on."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.processes import free_port
from tests.polling import wait_for
from tests.router.processes import (
    AUTH,
    MODEL,
    TOKEN,
    Process,
    child_env,
    engine_status,
    running,
    start_engine,
    start_router,
)
from tests.serve.conftest import text_prompt

# 64 attention blocks of 16 tokens: no request over (64 - 1) * 16 = 1008 tokens fits
SMALL = ("--num-blocks", "64")
BIGGER = ("--num-blocks", "128")  # (128 - 1) * 16 = 2032 tokens


def start_route(*args: str, **settings: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "route", "--port", str(free_port()), *args],
        env=child_env(**settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ended(process: subprocess.Popen) -> subprocess.CompletedProcess:
    """`process` run to its end (it must not start serving)."""
    try:
        stdout, stderr = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def route(*args: str, **settings: str) -> subprocess.CompletedProcess:
    """`junction route ARGS` to its end."""
    return ended(start_route(*args, **settings))


def assert_refused(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


# ---------------------------------------------------------------------- the command line
def test_no_engines() -> None:
    assert_refused(route(JUNCTION_API_TOKEN=TOKEN), "no engines", "--engine")


def test_a_bad_engine_url() -> None:
    assert_refused(
        route("--engine", "127.0.0.1:8000", JUNCTION_API_TOKEN=TOKEN), "'127.0.0.1:8000'"
    )
    assert_refused(route("--engine", "ftp://127.0.0.1:8000", JUNCTION_API_TOKEN=TOKEN), "ftp://")


def test_the_same_engine_twice() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert_refused(route("--engine", url, "--engine", url + "/", JUNCTION_API_TOKEN=TOKEN), "twice")


def test_no_token() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert_refused(route("--engine", url), "JUNCTION_API_TOKEN")


def test_a_negative_cache_key_spill() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = route("--engine", url, "--cache-key-spill-s", "-1", JUNCTION_API_TOKEN=TOKEN)
    assert_refused(done, "--cache-key-spill-s", "-1")


# ---------------------------------------------------------------------- requests
@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Process]]:
    log_dir = tmp_path_factory.mktemp("route-errors")
    started = [
        start_engine(log_dir, "small", *SMALL),
        start_engine(log_dir, "bigger", *BIGGER),
        start_engine(log_dir, "doomed"),  # for the test that kills it, started with the others
    ]
    with running(*started) as ready:
        yield ready


@pytest.fixture(scope="module")
def router(engines: list[Process], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    log_dir = tmp_path_factory.mktemp("route-errors-router")
    with running(start_router(log_dir, engines[:2])) as (started,):
        yield started


def chat(router: Process, content: str, model: str = MODEL, **fields) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **fields}
    return httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=30)


def error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_engines_that_never_answer_at_start(engines: list[Process]) -> None:
    """Nothing listens at two URLs; a live engine refuses the token: after its start timeout
    each command gives up naming its engines and why, rather than serving a fleet of none.
    `--start-timeout` shortens the wait (default 15 s): the refusal of the token reaches the
    router within milliseconds of its start, so 3 s leaves a loaded machine ample margin."""
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    timeout = ("--start-timeout", "3")
    unreachable = start_route(
        "--engine", urls[0], "--engine", urls[1], *timeout, JUNCTION_API_TOKEN=TOKEN
    )
    wrong_token = start_route(
        "--engine", engines[0].url, *timeout, JUNCTION_API_TOKEN="not-" + TOKEN
    )
    assert_refused(ended(unreachable), *urls, "within 3 s", "cannot reach")
    assert_refused(ended(wrong_token), engines[0].url, "within 3 s", "wrong bearer token")


def test_a_start_timeout_that_is_not_positive() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = route("--engine", url, "--start-timeout", "0", JUNCTION_API_TOKEN=TOKEN)
    assert_refused(done, "--start-timeout")


def test_an_unknown_model(router: Process) -> None:
    found = error(chat(router, "hello", model="gpt-4o"), 404)
    assert found["code"] == "model_not_found"
    assert "'gpt-4o'" in found["message"] and MODEL in found["message"]
    found = error(
        httpx.post(
            f"{router.url}/v1/completions", json={"model": "gpt-4o", "prompt": "hi"}, timeout=30
        ),
        404,
    )
    assert found["code"] == "model_not_found"


def test_malformed_json(router: Process) -> None:
    for body in (b'{"model": "junction-hybrid-tiny", "messages": [', b"[1, 2]", b""):
        response = httpx.post(
            f"{router.url}/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert error(response, 400)["code"] == "invalid_json"


def test_a_request_too_long_for_every_engine(router: Process) -> None:
    found = error(chat(router, text_prompt(1, 2100), max_tokens=8), 400)
    assert found["code"] == "too_long"
    assert "2032" in found["message"]  # the most the bigger engine takes


def test_a_request_only_the_bigger_engine_takes(router: Process, engines: list[Process]) -> None:
    """1500 tokens fit only the bigger engine: the router must send them there (every engine
    is tried in turn: a fresh prompt goes to the least loaded, so each would be picked once)."""
    for seed in range(3):
        response = chat(router, text_prompt(10 + seed, 1500), max_tokens=8)
        assert response.status_code == 200, response.text
        assert response.headers["x-junction-engine"] == engines[1].url


def test_fleet_needs_the_token(router: Process) -> None:
    for path in ("/fleet", "/fleet/decisions"):
        assert httpx.get(router.url + path, timeout=5).status_code == 401
        wrong = {"Authorization": "Bearer not-" + TOKEN}
        response = httpx.get(router.url + path, headers=wrong, timeout=5)
        assert error(response, 401)["code"] == "unauthorized"
        assert httpx.get(router.url + path, headers=AUTH, timeout=5).status_code == 200


def test_every_engine_down(engines: list[Process], tmp_path: Path) -> None:
    """A router of its own over the one engine this test kills."""
    doomed = engines[2]
    router = start_router(tmp_path, [doomed])
    try:
        assert chat(router, "hello", max_tokens=2).status_code == 200
        doomed.kill()
        wait_for(
            "the router to see its engine down", lambda: engine_status(router, doomed) == "down", 10
        )
        found = error(chat(router, "hello", max_tokens=2), 503)
        assert found["code"] == "no_engine"
        assert MODEL in found["message"]
    finally:
        router.stop()
