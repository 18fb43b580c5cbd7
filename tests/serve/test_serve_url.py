"""`junction serve --serve-url`: the URL its model card names for routers and the control
plane's discovery; by default http://HOST:PORT, and this machine's hostname in place of an
address that means every one (0.0.0.0, ::), as in a container; an URL that is not http(s) is
refused by the parser, exit 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest

from serve.cli import default_serve_url
from tests.api.processes import free_port
from tests.polling import wait_for
from tests.serve.test_cli import parse


def test_the_option_keeps_an_http_url_without_its_trailing_slash():
    assert parse(["serve"]).serve_url is None
    assert parse(["serve", "--serve-url", "http://engine-a:9000/"]).serve_url == (
        "http://engine-a:9000"
    )
    assert parse(["serve", "--serve-url", "https://e.example"]).serve_url == "https://e.example"


@pytest.mark.parametrize(
    "url", ["engine-a:9000", "ftp://engine-a", "http://", "http://engine-a:port", "http://e?x=1"]
)
def test_anything_else_is_refused_by_name(url, capsys):
    with pytest.raises(SystemExit) as exited:
        parse(["serve", "--serve-url", url])
    assert exited.value.code == 2
    assert f"--serve-url: {url!r} is not an http(s)://host:port URL" in capsys.readouterr().err


def test_the_default_names_this_machine_for_every_address():
    hostname = socket.gethostname()
    assert default_serve_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert default_serve_url("engine-a", 8001) == "http://engine-a:8001"
    assert default_serve_url("0.0.0.0", 8000) == f"http://{hostname}:8000"
    assert default_serve_url("::", 8002) == f"http://{hostname}:8002"
    assert default_serve_url("::1", 8003) == "http://[::1]:8003"


def served_card(port: int, *options: str) -> dict:
    """`junction serve --runner null --port PORT OPTIONS`: its model card, from /v1/models."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--runner", "null", "--port", str(port)]
        + ["--log-level", "warning", *options],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    models = f"http://127.0.0.1:{port}/v1/models"

    def serving() -> bool:
        if process.poll() is not None:
            raise RuntimeError(process.stderr.read().decode())
        try:
            return httpx.get(models, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for("junction serve", serving, 60)
        (card,) = httpx.get(models, timeout=5).json()["data"]
        return card["junction"]
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


def test_the_card_names_the_hostname_when_bound_to_every_address():
    port = free_port()
    card = served_card(port, "--host", "0.0.0.0")
    assert card["serve_url"] == f"http://{socket.gethostname()}:{port}"


def test_the_card_names_the_url_given():
    card = served_card(free_port(), "--serve-url", "http://engine-a.internal:9000/")
    assert card["serve_url"] == "http://engine-a.internal:9000"
