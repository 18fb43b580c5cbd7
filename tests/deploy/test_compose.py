"""docker-compose.yml, its GPU override, the Dockerfile and .env.example against the code:
every service's command is a real `junction` subcommand whose options parse, every
`JUNCTION_*` setting passed is one the settings know, and .env.example names every setting;
the token has no default and .env.example's is one the API refuses; every published port binds
to JUNCTION_BIND, this host only by default; the engines run as replicas, each its own engine
id and serve URL from its hostname, behind the router, which finds them through the control
plane. (No Docker engine runs here: the files are checked, not started.)"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from api.guards.token import EXAMPLE_TOKEN, TokenError, resolve_token
from api.settings import Settings
from cli.main import build_parser
from client.settings import ControlPlaneSettings, DashboardSettings

ROOT = Path(__file__).resolve().parents[2]
# the control plane's own settings and its clients' (where it is, the token they send)
SETTINGS_CLASSES = (Settings, ControlPlaneSettings, DashboardSettings)
SETTINGS = {f"JUNCTION_{name.upper()}" for cls in SETTINGS_CLASSES for name in cls.model_fields}
PROJECT_SERVICES = {"migrate", "api", "engine", "router", "dashboard", "worker", "beat", "attach"}
# the subcommand each service runs, where it is not the service's name
SUBCOMMANDS = {"engine": "serve", "router": "route"}
THIRD_PARTY = {"postgres", "redis", "lb"}  # the store, the broker, the balancer
# `${JUNCTION_API_TOKEN:?set JUNCTION_API_TOKEN ...}`: compose stops with the message when unset
NO_DEFAULT = r"\$\{JUNCTION_API_TOKEN:\?set JUNCTION_API_TOKEN [^}]+\}"
# `${JUNCTION_BIND:-127.0.0.1}:${API_PORT:-8080}:8080`: this host only, unless told otherwise
ON_JUNCTION_BIND = r"\$\{JUNCTION_BIND:-127\.0\.0\.1\}:\$\{\w+:-(\d+)\}:\1"


def compose(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


def parses(argv: list[str]) -> str:
    """The subcommand `junction ARGV` runs; fails the test with argparse's message if not."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 after printing what is wrong
        pytest.fail(f"`junction {' '.join(argv)}` does not parse (exit {exc.code})")
    assert callable(args.func)
    return args.command


def test_compose_runs_every_part_from_one_image() -> None:
    services = compose("docker-compose.yml")["services"]
    assert set(services) == PROJECT_SERVICES | THIRD_PARTY
    for name in PROJECT_SERVICES:
        service = services[name]
        assert service["image"] == "junction:latest" and service["build"] == "."
    for name in THIRD_PARTY:
        assert services[name]["healthcheck"]["test"], name
    for name in ("api", "worker", "beat"):
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }


@pytest.mark.parametrize("file", ["docker-compose.yml", "docker-compose.gpu.yml"])
def test_every_command_is_a_junction_subcommand(file: str) -> None:
    services = compose(file)["services"]
    assert services
    for name, service in services.items():
        if name in THIRD_PARTY:
            continue
        command = service["command"]
        expected = SUBCOMMANDS.get(name, name)
        assert parses(command) == expected, (file, name, command)


def test_every_setting_passed_is_one_the_settings_know() -> None:
    services = compose("docker-compose.yml")["services"]
    for name in PROJECT_SERVICES:
        passed = {key for key in services[name]["environment"] if key.startswith("JUNCTION_")}
        assert passed, name
        assert passed <= SETTINGS, (name, passed - SETTINGS)
        # and each value is one the settings accept (compose's ${VAR:-default} resolved)
        values = {
            key[len("JUNCTION_") :].lower(): re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))
            for key, value in services[name]["environment"].items()
        }
        for cls in SETTINGS_CLASSES:
            cls(_env_file=None, **values)
    assert compose("docker-compose.yml")["services"]["api"]["environment"][
        "JUNCTION_DATABASE_URL"
    ].startswith("postgresql://")


def test_the_gpu_override_asks_for_a_gpu() -> None:
    engine = compose("docker-compose.gpu.yml")["services"]["engine"]
    (device,) = engine["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    assert engine["command"][engine["command"].index("--device") + 1] == "cuda"


def test_env_example_names_every_setting_and_only_settings() -> None:
    names = {
        line.split("=", 1)[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }
    junction = {name for name in names if name.startswith("JUNCTION_")}
    assert junction == SETTINGS, (SETTINGS - junction, junction - SETTINGS)
    env = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line.startswith("JUNCTION_")
    )
    for cls in SETTINGS_CLASSES:
        cls(_env_file=None, **{k[len("JUNCTION_") :].lower(): v for k, v in env.items()})


def test_the_image_runs_the_junction_entry_point() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["junction"] == "cli.main:main"
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.M).group(1)
    cmd = re.search(r"^CMD (.+)$", dockerfile, re.M).group(1)
    assert json.loads(entrypoint) == ["junction"]
    assert parses(json.loads(cmd)) == "up"
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    included = {name.rstrip("*").removesuffix(".") for name in find["find"]["include"]}
    assert {"engine", "client", "serve", "cli"} <= included
    for folder in (*sorted(included), "migrations"):
        assert f"COPY {folder} {folder}" in dockerfile, folder


def test_the_token_has_no_default() -> None:
    services = compose("docker-compose.yml")["services"]
    for name in PROJECT_SERVICES:
        token = services[name]["environment"]["JUNCTION_API_TOKEN"]
        assert re.fullmatch(NO_DEFAULT, token), token
    text = (ROOT / "docker-compose.yml").read_text()
    assert "change-me" not in text and "junction-dev-token" not in text


@pytest.mark.parametrize("file", ["docker-compose.yml", "docker-compose.gpu.yml"])
def test_every_published_port_binds_to_junction_bind(file: str) -> None:
    services = compose(file)["services"]
    published = [(name, port) for name, s in services.items() for port in s.get("ports", [])]
    if file == "docker-compose.yml":
        assert {name for name, _ in published} == {"lb", "router", "dashboard"}
    for name, port in published:
        assert re.fullmatch(ON_JUNCTION_BIND, port), (file, name, port)
    for name in ("postgres", "redis"):  # the store and the broker are not published at all
        assert "ports" not in services.get(name, {}), name


def test_env_example_has_a_token_the_api_refuses() -> None:
    env = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line.startswith("JUNCTION_")
    )
    assert env["JUNCTION_API_TOKEN"] == EXAMPLE_TOKEN
    with pytest.raises(TokenError, match="placeholder of .env.example"):
        resolve_token(Settings(_env_file=None, api_token=env["JUNCTION_API_TOKEN"]))


def test_every_long_running_service_has_a_healthcheck() -> None:
    services = compose("docker-compose.yml")["services"]
    for name, service in services.items():
        if name == "migrate":  # runs once, then exits
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), name
    # the HTTP ones ask the port the service's command listens on, at a path it serves
    from api.routes import health
    from router.routes import ops as router_ops
    from serve.routes import ops

    assert "/healthz" in {route.path for route in health.router.routes}
    assert "/health" in {route.path for route in ops.router.routes}
    assert "/health" in {route.path for route in router_ops.router.routes}
    paths = {
        "api": "/healthz",
        "engine": "/health",
        "router": "/health",
        "dashboard": "/_stcore/health",
    }
    for name, path in paths.items():
        command = services[name]["command"]
        port = command[command.index("--port") + 1]
        test = " ".join(services[name]["healthcheck"]["test"])
        assert f"'http://127.0.0.1:{port}{path}'" in test, (name, test)


def test_every_long_running_service_is_started_again_when_it_exits() -> None:
    """As `junction up` does: `unless-stopped`, which Docker backs off by itself and never gives
    up on; the one-shot migration is not."""
    services = compose("docker-compose.yml")["services"]
    for name, service in services.items():
        expected = "no" if name == "migrate" else "unless-stopped"
        assert service.get("restart") == expected, name


def test_the_engine_has_a_models_volume_its_weights_option_reads() -> None:
    spec = compose("docker-compose.yml")
    mounts = dict(volume.split(":", 1) for volume in spec["services"]["engine"]["volumes"])
    assert mounts.get("models") == "/models"
    assert "models" in spec["volumes"]
    text = (ROOT / "docker-compose.yml").read_text()
    assert '"--weights", "/models/x.safetensors"' in text
    command = spec["services"]["engine"]["command"]
    assert parses([*command, "--weights", "/models/x.safetensors"]) == "serve"


def test_the_api_runs_as_replicas_behind_the_balancer() -> None:
    """Several replicas, none published: the balancer is the one way in, for the engine, the
    dashboard and the jobs too; its configuration is the one `stack.balancer` writes (the
    settings the end-to-end test runs HAProxy with), and HAProxy itself accepts it."""
    from stack.balancer import compose_config, haproxy_binary

    services = compose("docker-compose.yml")["services"]
    api = services["api"]
    assert re.fullmatch(r"\$\{API_REPLICAS:-(\d+)\}", str(api["deploy"]["replicas"]))
    assert int(re.search(r"\d+", str(api["deploy"]["replicas"])).group()) >= 2
    assert "ports" not in api
    for name in PROJECT_SERVICES:
        url = services[name]["environment"]["JUNCTION_CONTROL_PLANE_URL"]
        assert url == "http://lb:8080", (name, url)
    lb = services["lb"]
    assert lb["image"].startswith("haproxy:")
    assert "./stack/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in lb["volumes"]
    for name in ("engine", "dashboard", "attach"):
        assert services[name]["depends_on"]["lb"] == {"condition": "service_healthy"}, name
    config = (ROOT / "stack/haproxy.cfg").read_text()
    assert config == compose_config()
    assert "server-template api" in config and "option httpchk GET /healthz" in config
    check = subprocess.run(
        [haproxy_binary(), "-c", "-f", str(ROOT / "stack/haproxy.cfg")], capture_output=True
    )
    assert check.returncode == 0, check.stderr.decode()


def entrypoint_argv(service: dict, tmp_path: Path, hostname: str) -> list[str]:
    """The `junction` argv a replica of `service` runs: its entrypoint (compose's `$$` is `$`)
    run by sh with the container's HOSTNAME, a stand-in `junction` printing its arguments."""
    junction = tmp_path / "junction"
    junction.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    junction.chmod(junction.stat().st_mode | stat.S_IEXEC)
    argv = [part.replace("$$", "$") for part in service["entrypoint"]] + service["command"]
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "HOSTNAME": hostname}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_the_engines_are_replicas_behind_the_router(tmp_path: Path) -> None:
    """ENGINES replicas (2 by default), none published, each with its own engine id and the URL
    its hostname gives (bound to 0.0.0.0, no --serve-url: serve's default); the router, the
    one way in for OpenAI clients, finds them through the control plane's discovery."""
    from serve.cli import default_serve_url

    services = compose("docker-compose.yml")["services"]
    engine = services["engine"]
    assert re.fullmatch(r"\$\{ENGINES:-(\d+)\}", str(engine["deploy"]["replicas"]))
    assert int(re.search(r"\d+", str(engine["deploy"]["replicas"])).group()) >= 2
    assert "ports" not in engine
    for hostname in ("3f2a9c1b7d0e", "0c4e8a2f6b1d"):
        argv = entrypoint_argv(engine, tmp_path, hostname)
        args = build_parser().parse_args(argv)
        assert args.command == "serve" and args.host == "0.0.0.0" and args.serve_url is None
        assert args.engine_id == f"engine-{hostname}"  # one id per replica
        assert default_serve_url(args.host, args.port).endswith(f":{args.port}")
    router = services["router"]
    args = build_parser().parse_args(router["command"])
    assert args.command == "route" and args.engine == []  # the engines come from discovery
    assert args.control_plane == router["environment"]["JUNCTION_CONTROL_PLANE_URL"]
    assert (args.host, args.port) == ("0.0.0.0", 8000)
    assert router["ports"] == ["${JUNCTION_BIND:-127.0.0.1}:${ENGINE_PORT:-8000}:8000"]
    assert router["depends_on"] == {
        "lb": {"condition": "service_healthy"},
        "engine": {"condition": "service_healthy"},
    }
    assert parses([*router["command"], "--model", "/models/bamba-9b"]) == "route"
    assert dict(v.split(":", 1) for v in router["volumes"])["models"].startswith("/models")


@pytest.mark.parametrize("files", [("docker-compose.yml",), ("docker-compose.gpu.yml",)])
def test_the_engines_share_units_through_the_compose_redis_on_a_db_of_their_own(files) -> None:
    """Issue 49: the replicas' shared tier is the compose Redis, on a DB Celery does not use."""
    base = compose("docker-compose.yml")
    spec = compose(files[0])
    command = spec["services"]["engine"]["command"]
    url = command[command.index("--shared-cache-url") + 1]
    celery = base["x-junction"]["environment"] if "x-junction" in base else {}
    used = {
        value.rsplit("/", 1)[1]
        for value in celery.values()
        if isinstance(value, str) and value.startswith("redis://redis:6379/")
    }
    assert re.fullmatch(r"redis://redis:6379/(\d+)", url)
    assert url.rsplit("/", 1)[1] not in used | {"0", "1"}
    assert "redis" in base["services"]["engine"]["depends_on"]
    assert parses(command) == "serve"
