"""`junction dashboard` and the live refresh's pause toggle."""

from __future__ import annotations

import os
from pathlib import Path

from streamlit.testing.v1 import AppTest

from cli.main import build_parser
from dashboard import cli


def test_dashboard_command_runs_streamlit_headless_on_the_app():
    args = build_parser().parse_args(
        ["dashboard", "--port", "8611", "--api-url", "http://cp.example:9000"]
    )
    assert args.func is cli.cmd_dashboard
    command = cli.streamlit_command(args.host, args.port)
    assert command[1:4] == ["-m", "streamlit", "run"]
    assert Path(command[4]) == Path(cli.__file__).with_name("app.py")
    assert "--server.headless=true" in command and "--server.port=8611" in command
    env = cli.streamlit_env(args.api_url)
    assert env["JUNCTION_CONTROL_PLANE_URL"] == "http://cp.example:9000"
    root = str(Path(cli.__file__).parents[1])
    assert env["PYTHONPATH"].split(os.pathsep)[0] == root


def test_dashboard_defaults_to_the_settings_url(monkeypatch):
    monkeypatch.setenv("JUNCTION_CONTROL_PLANE_URL", "http://from-settings:8080")
    args = build_parser().parse_args(["dashboard"])
    assert args.port == 8501 and args.api_url is None
    assert cli.streamlit_env(args.api_url)["JUNCTION_CONTROL_PLANE_URL"] == (
        "http://from-settings:8080"
    )


def test_dashboard_passes_the_router_url_to_the_fleet_page(monkeypatch):
    monkeypatch.delenv("JUNCTION_ROUTER_URL", raising=False)
    args = build_parser().parse_args(["dashboard", "--router-url", "http://router:8100"])
    assert cli.streamlit_env(args.api_url, args.router_url)["JUNCTION_ROUTER_URL"] == (
        "http://router:8100"
    )
    args = build_parser().parse_args(["dashboard"])
    assert args.router_url is None
    assert "JUNCTION_ROUTER_URL" not in cli.streamlit_env(args.api_url, args.router_url)


def live_script() -> None:
    import streamlit as st

    from dashboard.live import live

    def body() -> None:
        st.session_state["runs"] = st.session_state.get("runs", 0) + 1
        st.write(f"body ran {st.session_state['runs']}")

    live(body)


def test_live_refresh_runs_the_body_and_pauses(monkeypatch):
    monkeypatch.setenv("JUNCTION_DASHBOARD_REFRESH_S", "2.5")
    at = AppTest.from_function(live_script).run()
    assert at.markdown[0].value == "body ran 1"
    assert at.sidebar.caption[0].value == "Refreshing every 2.5 s."
    at.sidebar.toggle(key="live_paused").set_value(True).run()
    assert at.sidebar.caption[0].value == "Paused."
    assert at.markdown[0].value == "body ran 2"
