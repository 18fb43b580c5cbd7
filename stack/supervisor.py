"""Runs the parts of the stack: checks their ports, starts them in order, streams each one's
log with its name in front, waits until each serves, and stops them all, last started first,
on Ctrl-C, on SIGTERM, or when one of them dies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

import httpx

from stack.parts import Part

COLORS = ("36", "32", "35", "33", "34", "31")  # cyan, green, magenta, yellow, blue, red


class PortTaken(RuntimeError):
    pass


class PartFailed(RuntimeError):
    pass


def check_ports(host: str, parts: list[Part]) -> None:
    """Raises `PortTaken` naming every part whose port something else holds."""
    taken = []
    for part in parts:
        if part.port is None:
            continue
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, part.port))
            except OSError as exc:
                taken.append(f"port {part.port} ({part.name}) on {host}: {exc.strerror}")
    if taken:
        raise PortTaken(
            "cannot start: "
            + "; ".join(taken)
            + ". Stop what holds it or choose other ports (--api-port, --engine-port, "
            "--dashboard-port)."
        )


@dataclass
class Running:
    part: Part
    process: subprocess.Popen


class Supervisor:
    def __init__(
        self,
        parts: list[Part],
        env: dict[str, str] | None = None,
        out: TextIO = sys.stdout,
        color: bool | None = None,
    ) -> None:
        self.parts = parts
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.out = out
        self.color = out.isatty() if color is None else color
        self.running: list[Running] = []
        self.lock = threading.Lock()
        self.width = max(len(p.name) for p in parts)
        self.stopping = threading.Event()

    # ------------------------------------------------------------------ output
    def say(self, name: str, line: str) -> None:
        index = next((i for i, p in enumerate(self.parts) if p.name == name), None)
        label = f"{name:>{self.width}} |"
        if self.color and index is not None:
            label = f"\033[{COLORS[index % len(COLORS)]}m{label}\033[0m"
        with self.lock:
            self.out.write(f"{label} {line.rstrip()}\n")
            self.out.flush()

    def _pump(self, running: Running) -> None:
        for line in running.process.stdout:
            self.say(running.part.name, line)

    # ------------------------------------------------------------------ lifecycle
    def start(self, ready_timeout_s: float = 180) -> None:
        """Start every part in order, each once the one before it serves."""
        for part in self.parts:
            if self.stopping.is_set():
                return
            process = subprocess.Popen(
                part.argv,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,  # Ctrl-C reaches `up` alone; it stops them in order
            )
            running = Running(part, process)
            self.running.append(running)
            threading.Thread(target=self._pump, args=(running,), daemon=True).start()
            self.say(part.name, f"started (pid {process.pid}): {' '.join(part.argv[1:])}")
            if part.ready_url:
                self._wait_ready(running, ready_timeout_s)

    def _wait_ready(self, running: Running, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stopping.is_set():
            if running.process.poll() is not None:
                raise PartFailed(
                    f"{running.part.name} exited with code {running.process.returncode} while "
                    "starting (its log is above)"
                )
            try:
                if httpx.get(running.part.ready_url, timeout=2).status_code == 200:
                    self.say(running.part.name, f"ready at {running.part.url}")
                    if running.part.engine_id is not None:
                        self._wait_accepted(running, deadline)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        if not self.stopping.is_set():
            raise PartFailed(
                f"{running.part.name} did not answer {running.part.ready_url} in {timeout_s:g} s"
            )

    def _wait_accepted(self, running: Running, deadline: float) -> None:
        """Until the control plane lists the engine connected: its `/health` answers before
        its feed's hello is welcomed, and "Junction is up" printed seconds before it was."""
        part = running.part
        control_plane = self.env.get("JUNCTION_CONTROL_PLANE_URL")
        token = self.env.get("JUNCTION_API_TOKEN")
        if not control_plane or not token:
            return  # a stack with no control plane of its own to ask
        url = f"{control_plane}/api/v1/engines/{part.engine_id}"
        headers = {"Authorization": f"Bearer {token}"}
        while time.monotonic() < deadline and not self.stopping.is_set():
            if running.process.poll() is not None:
                raise PartFailed(
                    f"{part.name} exited with code {running.process.returncode} before the "
                    "control plane accepted it (its log is above)"
                )
            try:
                answer = httpx.get(url, headers=headers, timeout=2)
                if answer.status_code == 200 and answer.json().get("connected"):
                    self.say(part.name, f"accepted by the control plane as {part.engine_id}")
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.25)
        if not self.stopping.is_set():
            raise PartFailed(
                f"the control plane did not accept {part.name} as {part.engine_id} in time "
                "(its log above says why)"
            )

    def watch(self) -> str | None:
        """Block until a part exits or `stop` is asked for; returns the name of a part that
        died (None when asked to stop)."""
        while not self.stopping.wait(0.5):
            for running in self.running:
                code = running.process.poll()
                if code is not None:
                    return f"{running.part.name} exited with code {code}"
        return None

    def stop(self, timeout_s: float = 20) -> None:
        """SIGTERM (SIGINT for Celery, which then shuts down warm) each part, last started
        first; SIGKILL what is still running after `timeout_s`."""
        self.stopping.set()
        for running in reversed(self.running):
            if running.process.poll() is None:
                self.say(running.part.name, "stopping")
                stop_signal = signal.SIGINT if running.part.name in ("worker", "beat") else None
                _signal_group(running.process, stop_signal or signal.SIGTERM)
                try:
                    running.process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.say(running.part.name, f"still running after {timeout_s:g} s: killing")
                    _signal_group(running.process, signal.SIGKILL)
                    running.process.wait(10)
            # the rest of its group (a worker's pool processes, streamlit's children)
            _signal_group(running.process, signal.SIGKILL)
            self.say(running.part.name, stopped_text(running.process.returncode))


def stopped_text(code: int | None) -> str:
    """How a part this stack stopped ended: 0, or death by the SIGTERM or SIGINT `stop` sent
    (uvicorn raises the signal again once it has shut down), is a clean stop; anything else
    is said with its code."""
    if code in (0, -signal.SIGTERM, -signal.SIGINT):
        return "stopped"
    return f"stopped (exit code {code})"


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
