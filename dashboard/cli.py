"""`junction dashboard`: Streamlit on `dashboard/app.py`, headless, against the control plane
at `--api-url` (default `JUNCTION_CONTROL_PLANE_URL`) and the router at `--router-url` (default
`JUNCTION_ROUTER_URL`); it reads both with `JUNCTION_READ_TOKEN`, else `JUNCTION_API_TOKEN`, and
writes only with the token a visitor enters (`dashboard.connection`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from client.settings import DEFAULT_URL, ControlPlaneSettings, DashboardSettings

APP = Path(__file__).with_name("app.py")


def add_dashboard_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("dashboard", help="the Streamlit dashboard over the REST API")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8501)
    parser.add_argument(
        "--api-url",
        default=None,
        help=f"the control plane's URL (default: JUNCTION_CONTROL_PLANE_URL, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--router-url",
        default=None,
        help="`junction route`'s URL, for the Fleet page (default: JUNCTION_ROUTER_URL, else none)",
    )
    parser.set_defaults(func=cmd_dashboard)


def streamlit_command(host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.address={host}",
        f"--server.port={port}",
        "--server.fileWatcherType=none",
        "--browser.gatherUsageStats=false",
        "--client.toolbarMode=minimal",
    ]


def streamlit_env(api_url: str | None, router_url: str | None = None) -> dict[str, str]:
    """The environment: the API's and the router's URLs, and the repository root importable
    (Streamlit puts only the script's folder on the path)."""
    env = dict(os.environ)
    if api_url:
        env["JUNCTION_CONTROL_PLANE_URL"] = api_url
    if router_url:
        env["JUNCTION_ROUTER_URL"] = router_url
    root = str(APP.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def cmd_dashboard(args: argparse.Namespace) -> int:
    # checked here, once, before Streamlit takes the process (bad ones: `cli.main` says which)
    ControlPlaneSettings()
    DashboardSettings()
    command = streamlit_command(args.host, args.port)
    env = streamlit_env(args.api_url, args.router_url)
    os.execve(command[0], command, env)  # Streamlit takes the process
    return 0  # not reached
