"""Runs the parts of the stack: checks their ports, starts them in order, streams each one's
log with its name in front, waits until each serves, starts again a part that exits after it
started (`stack.restarts`: with backoff; one that keeps dying is left down and reported), and
stops them all, last started first, on Ctrl-C or SIGTERM alone."""

from __future__ import annotations

import contextlib
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
from stack.restarts import Exits, RestartPolicy, Tail

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
    exits: Exits
    tail: Tail
    process: subprocess.Popen | None = None
    pump: threading.Thread | None = None  # reads the process's output
    is_started: bool = False  # served once: an exit from now on is started again
    restart_at: float | None = None  # exited: started again at this monotonic time
    is_left_down: bool = False  # kept dying: not started again
    ready_timeout_s: float = 180  # how long a part started again may take to serve


class Supervisor:
    def __init__(
        self,
        parts: list[Part],
        env: dict[str, str] | None = None,
        out: TextIO = sys.stdout,
        color: bool | None = None,
        policy: RestartPolicy | None = None,
    ) -> None:
        self.parts = parts
        self.policy = policy or RestartPolicy()
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.out = out
        self.color = out.isatty() if color is None else color
        self.running: list[Running] = []
        self.lock = threading.Lock()
        self.width = max(len(p.name) for p in parts)
        self.stopping = threading.Event()
        self.is_out_gone = False

    # ------------------------------------------------------------------ output
    def say(self, name: str, line: str) -> None:
        index = next((i for i, p in enumerate(self.parts) if p.name == name), None)
        label = f"{name:>{self.width}} |"
        if self.color and index is not None:
            label = f"\033[{COLORS[index % len(COLORS)]}m{label}\033[0m"
        with self.lock:
            if self.is_out_gone:
                return
            try:
                self.out.write(f"{label} {line.rstrip()}\n")
                self.out.flush()
            except (OSError, ValueError):
                # the terminal or pipe it printed to is gone (`junction up | head`, a closed
                # window): the parts are still tended and, on SIGTERM, stopped
                self.is_out_gone = True

    def _pump(self, running: Running, process: subprocess.Popen) -> None:
        for line in process.stdout:
            running.tail.add(line)
            self.say(running.part.name, line)

    # ------------------------------------------------------------------ lifecycle
    def start(self, ready_timeout_s: float = 180) -> None:
        """Start every part in order, each once the one before it serves. A part that exits
        while it starts fails the start (`PartFailed`); one that served and exits later is
        started again (`tend`)."""
        for part in self.parts:
            if self.stopping.is_set():
                return
            running = Running(
                part,
                Exits(self.policy),
                Tail(self.policy.tail_lines),
                ready_timeout_s=ready_timeout_s,
            )
            self.running.append(running)
            self._spawn(running)
            if part.ready_url:
                self._wait_ready(running, ready_timeout_s)
            running.is_started = True

    def _spawn(self, running: Running) -> None:
        part = running.part
        process = subprocess.Popen(
            part.argv,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # Ctrl-C reaches `up` alone; it stops them in order
        )
        running.process = process
        running.pump = threading.Thread(target=self._pump, args=(running, process), daemon=True)
        running.pump.start()
        self.say(part.name, f"started (pid {process.pid}): {' '.join(part.argv[1:])}")

    def _wait_ready(self, running: Running, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stopping.is_set():
            self.tend()  # the parts started before it
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
            self.tend()
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

    def watch(self) -> None:
        """Tend the parts until `stop` is asked for (Ctrl-C, SIGTERM)."""
        while not self.stopping.wait(0.2):
            self.tend()

    def tend(self) -> None:
        """Start again each part that served and has exited, once its backoff is over; leave
        down, reported with its last lines, one that keeps dying."""
        for running in self.running:
            if not running.is_started or running.is_left_down or self.stopping.is_set():
                continue
            now = time.monotonic()
            if running.restart_at is not None:
                if now >= running.restart_at:
                    running.restart_at = None
                    self._spawn(running)
                    if running.part.ready_url:
                        threading.Thread(
                            target=self._say_when_ready,
                            args=(running, running.process),
                            daemon=True,
                        ).start()
                continue
            code = running.process.poll()
            if code is None:
                continue
            _signal_group(running.process, signal.SIGKILL)  # what it left (a worker's pool)
            backoff = running.exits.exited(now)
            recent = running.exits.num_recent(now)
            window = f"{recent} of {self.policy.max_exits} in {self.policy.window_s:g} s"
            if backoff is not None:
                running.restart_at = now + backoff
                self.say(
                    running.part.name,
                    f"exited with code {code}: restart {running.exits.num_restarts} in "
                    f"{backoff:g} s (exits: {window})",
                )
            else:
                running.is_left_down = True
                self._report_left_down(running, code, window)

    def _report_left_down(self, running: Running, code: int, window: str) -> None:
        if running.pump is not None:
            running.pump.join(2)  # its last lines read
        name = running.part.name
        lines = list(running.tail.lines)
        self.say(
            name,
            f"exited with code {code} and keeps dying (exits: {window}): left down, "
            f"not started again; its last {len(lines)} lines:",
        )
        for line in lines:
            self.say(name, f"    {line}")
        with contextlib.suppress(OSError, ValueError):  # as `say`
            print(
                f"junction up: {name} keeps dying (exit code {code}): left down; the rest keep "
                "running (Ctrl-C stops them)",
                file=sys.stderr,
                flush=True,
            )

    def _say_when_ready(self, running: Running, process: subprocess.Popen) -> None:
        """Say when a part started again serves (or nothing, if it exits first)."""
        deadline = time.monotonic() + running.ready_timeout_s
        while time.monotonic() < deadline and not self.stopping.is_set():
            if process.poll() is not None:
                return
            try:
                if httpx.get(running.part.ready_url, timeout=2).status_code == 200:
                    self.say(running.part.name, f"ready again at {running.part.url}")
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)

    def left_down(self) -> list[str]:
        """The parts that kept dying, left down."""
        return [running.part.name for running in self.running if running.is_left_down]

    def stop(self, timeout_s: float = 20) -> None:
        """SIGTERM (SIGINT for Celery, which then shuts down warm) each part, last started
        first; SIGKILL what is still running after `timeout_s`."""
        self.stopping.set()
        for running in reversed(self.running):
            if running.process is None:
                continue
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
            code = running.process.returncode
            said = f"left down (exit code {code})" if running.is_left_down else stopped_text(code)
            self.say(running.part.name, said)


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
