"""Bad settings: one short line each from every command, naming the `JUNCTION_*` variable, its
value and what it accepts, exit 2, no traceback; `junction up` says every part's before it
starts anything."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from api.settings import Settings
from client.settings_errors import describe, short
from stack.settings_check import settings_problems
from tests.api.processes import free_port


def junction(cwd: Path, *args: str, **settings: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")} | settings
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_said_briefly(answer: subprocess.CompletedProcess, *names: str) -> None:
    assert answer.returncode == 2, answer.stderr
    assert "Traceback" not in answer.stderr, answer.stderr
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == len(names), answer.stderr
    for name, line in zip(names, lines, strict=True):
        assert name in line, line
        assert len(line) < 200, line


@pytest.mark.parametrize("command", ["api", "migrate", "beat", "worker"])
def test_a_bad_log_level_is_one_line_naming_the_variable(tmp_path: Path, command: str) -> None:
    answer = junction(tmp_path, command, JUNCTION_LOG_LEVEL="verbose")
    assert_said_briefly(answer, "JUNCTION_LOG_LEVEL")
    assert "'verbose'" in answer.stderr and "'critical'" in answer.stderr
    assert not (tmp_path / "junction.db").exists()  # nothing ran


def test_each_bad_setting_has_its_line(tmp_path: Path) -> None:
    answer = junction(
        tmp_path, "api", JUNCTION_MAX_BODY_BYTES="-3", JUNCTION_HEADER_TIMEOUT_S="soon"
    )
    assert_said_briefly(answer, "JUNCTION_MAX_BODY_BYTES='-3'", "JUNCTION_HEADER_TIMEOUT_S")
    assert "positive" in answer.stderr and "number" in answer.stderr


def test_the_beat_says_a_bad_crontab_in_one_line(tmp_path: Path) -> None:
    answer = junction(tmp_path, "beat", JUNCTION_BENCHMARK_SCHEDULE="0 3 * *")
    assert_said_briefly(answer, "JUNCTION_BENCHMARK_SCHEDULE='0 3 * *'")
    assert "5 crontab fields" in answer.stderr


def test_up_with_bad_settings_starts_nothing_and_says_all(tmp_path: Path) -> None:
    ports = [free_port(), free_port(), free_port()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUNCTION_")}
    env |= {
        "JUNCTION_BENCHMARK_SCHEDULE": "0 25 * * *",
        "JUNCTION_DASHBOARD_REFRESH_S": "fast",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "up", "--api-port", str(ports[0])]
        + ["--engine-port", str(ports[1]), "--dashboard-port", str(ports[2])],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    opened = []
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        for port in ports:
            with socket.socket() as probe:
                probe.settimeout(0.05)
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    opened.append(port)
        time.sleep(0.05)
    stdout, stderr = process.communicate(timeout=30)
    answer = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert_said_briefly(answer, "JUNCTION_DASHBOARD_REFRESH_S", "JUNCTION_BENCHMARK_SCHEDULE")
    assert opened == [] and "Junction is up" not in stdout and "started" not in stdout
    assert not (tmp_path / "junction.db").exists()  # not even migrated


def test_the_crontab_is_checked_even_beside_other_bad_settings(monkeypatch) -> None:
    monkeypatch.chdir("/")
    monkeypatch.setenv("JUNCTION_LOG_LEVEL", "loud")
    monkeypatch.setenv("JUNCTION_BENCHMARK_SCHEDULE", "nightly")
    problems = settings_problems()
    assert [p.split("=")[0] for p in problems] == [
        "JUNCTION_LOG_LEVEL",
        "JUNCTION_BENCHMARK_SCHEDULE",
    ]
    assert settings_problems(with_jobs=False)[1:] == []


@pytest.mark.parametrize("given", ["DEBUG", "Warning", " error "])
def test_the_log_level_takes_any_case(given: str) -> None:
    assert Settings(_env_file=None, log_level=given).log_level == given.strip().lower()


def test_a_long_value_is_cut() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(_env_file=None, max_connections="9" * 30 + "x" * 100)
    (line,) = describe(caught.value)
    assert line.startswith("JUNCTION_MAX_CONNECTIONS='999") and len(line) < 150
    assert len(short("y" * 1000)) <= 40


def test_the_clients_settings_are_said_the_same_way() -> None:
    """`pin`, `pins`, `serve`, `replay` and the dashboard read `ControlPlaneSettings`."""
    from client.settings import ControlPlaneSettings
    from client.settings_errors import is_settings_error

    with pytest.raises(ValidationError) as caught:
        ControlPlaneSettings(_env_file=None, control_plane_url=8080)
    assert is_settings_error(caught.value)
    assert describe(caught.value) == ["JUNCTION_CONTROL_PLANE_URL='8080': should be a valid string"]
