"""HAProxy in front of several `junction api` replicas: the load balancer compose runs
(`stack/haproxy.cfg`, the same settings over Docker's DNS), here as a process of Debian's
`haproxy` package for the end-to-end test and the ingest benchmark.

It passes websockets through (HTTP/1.1 upgrade, then a tunnel kept for `TUNNEL_TIMEOUT`),
sends each new connection to the replica with the fewest, and checks every replica's
`/healthz` every second: one that fails three checks in a row (no answer in `CHECK_TIMEOUT`)
gets no new connections, but keeps the sockets it holds. A replica that dies (a kill -9
included) loses them with its process, and their engines reconnect, through the balancer, to
the others; one that is only slow (a backlog to ingest) keeps its engines, since cutting them
would only add their reconnects and resends to its load.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

TUNNEL_TIMEOUT = "1h"  # an engine's socket may idle this long between frames
CHECK_INTERVAL = "1s"
CHECK_TIMEOUT = "3s"  # a replica busy with a backlog answers /healthz late, not never
INSTALL_HINT = "install Debian's haproxy package (apt-get install haproxy)"


class BalancerError(RuntimeError):
    pass


def haproxy_binary() -> str:
    """The `haproxy` executable; `BalancerError` saying how to get it when there is none."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise BalancerError(f"haproxy is not installed: {INSTALL_HINT}")
    return found


def haproxy_config(bind: str, backends: list[str]) -> str:
    """The configuration of a balancer listening on `bind` (`host:port`) in front of
    `backends` (each `host:port` of a `junction api`)."""
    if not backends:
        raise BalancerError("a balancer needs at least one backend (host:port)")
    servers = [f"server api{index} {address} check" for index, address in enumerate(backends, 1)]
    return _config(bind, servers)


def compose_config(service: str = "api", port: int = 8080, max_replicas: int = 10) -> str:
    """`stack/haproxy.cfg`, compose's: the replicas of `service` found through Docker's DNS
    (up to `max_replicas` of them, as `docker compose up --scale api=N` adds or removes
    them). Written by `python -m stack.balancer > stack/haproxy.cfg`; a test checks it."""
    resolvers = [
        "resolvers docker",
        "    nameserver dns 127.0.0.11:53",
        "    hold valid 5s",
        "",
    ]
    servers = [
        f"server-template {service} {max_replicas} {service}:{port} check"
        " resolvers docker init-addr none"
    ]
    header = (
        "# Written by `python -m stack.balancer > stack/haproxy.cfg`: edit stack/balancer.py.\n"
    )
    return header + _config(f":{port}", servers, resolvers, monitor="/lb-health")


def _config(
    bind: str, servers: list[str], preamble: list[str] = (), monitor: str | None = None
) -> str:
    lines = [
        "global",
        "    maxconn 4096",
        "",
        *preamble,
        "defaults",
        "    mode http",
        "    option http-server-close",
        "    timeout connect 2s",
        "    timeout client 60s",
        "    timeout server 60s",
        "    timeout http-request 10s",
        f"    timeout tunnel {TUNNEL_TIMEOUT}",
        "    timeout client-fin 5s",
        "    option redispatch",
        "    retries 2",
        "",
        "frontend junction",
        f"    bind {bind}",
        *([f"    monitor-uri {monitor}"] if monitor else []),
        "    default_backend api",
        "",
        "backend api",
        "    balance leastconn",
        "    option httpchk GET /healthz",
        "    http-check expect status 200",
        "    timeout check " + CHECK_TIMEOUT,
        f"    default-server inter {CHECK_INTERVAL} fall 3 rise 2",
        *(f"    {server}" for server in servers),
    ]
    return "\n".join(lines) + "\n"


class Balancer:
    """HAProxy on `127.0.0.1:port` in front of `backends`, in its own process while the
    context is open (or between `start()` and `stop()`)."""

    def __init__(self, backends: list[str], port: int, host: str = "127.0.0.1") -> None:
        self.backends = list(backends)
        self.host, self.port = host, port
        self.process: subprocess.Popen | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="junction-haproxy-")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> None:
        """Start HAProxy and wait until its port accepts connections."""
        config = Path(self._dir.name) / "haproxy.cfg"
        config.write_text(haproxy_config(f"{self.host}:{self.port}", self.backends))
        binary = haproxy_binary()
        check = subprocess.run([binary, "-c", "-q", "-f", str(config)], capture_output=True)
        if check.returncode != 0:
            raise BalancerError(f"haproxy refused its configuration: {check.stderr.decode()}")
        log = (Path(self._dir.name) / "haproxy.log").open("wb")
        self.process = subprocess.Popen(
            [binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BalancerError(f"haproxy exited: {self.log()}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise BalancerError(f"haproxy did not listen on {self.host}:{self.port} in {timeout_s} s")

    def log(self) -> str:
        path = Path(self._dir.name) / "haproxy.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def __enter__(self) -> Balancer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._dir.cleanup()


if __name__ == "__main__":
    print(compose_config(), end="")
