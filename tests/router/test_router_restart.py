"""Two `junction route`s over the same three real `junction serve --runner null` engines: a
router killed (SIGKILL) under load and started again on its port rebuilds from the engines'
snapshots and then chooses as the router that never stopped does; two routers behind one
balancer choose alike; a router started while an engine is frozen says `degraded`, naming it,
routes by the others, and says `ready` once it is back.

Agreement is counted with `POST /fleet/route`: before each request of the measured phase the
client asks both routers what they would choose for its body, then sends it. The load is
families of shared prefixes (a system prompt's worth of token ids each, then a question of
their own), sent by a few clients at once, every family started before the measured phase: a
family's first request finds no cache anywhere, and which idle engine it goes to is the
router's own tie-break (the engine it sent fewest), which a restarted router has lost.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.polling import wait_for
from tests.router.processes import (
    AUTH,
    MODEL,
    Process,
    fleet,
    running,
    start_engine,
    start_router,
)

ENGINE_IDS = ("e0", "e1", "e2")
NUM_FAMILIES = 9
NUM_CLIENTS = 4
NUM_MEASURED = 120  # requests whose decisions both routers are asked for
AGREEMENT = 0.95  # the bar: decisions of the two routers that name the same engine


@dataclass
class Families:
    """Prompts of token ids: each family's prefix, then a question of its own."""

    seed: int
    prefixes: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        draw = random.Random(self.seed)
        for number in range(NUM_FAMILIES):
            length = 1000 + 250 * number
            self.prefixes.append([draw.randrange(1, 250) for _ in range(length)])

    def body(self, family: int, question: int) -> dict:
        draw = random.Random(f"{self.seed}-{family}-{question}")
        tail = [draw.randrange(1, 250) for _ in range(40)]
        prompt = self.prefixes[family] + tail
        return {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0}


def send(router: Process, body: dict) -> httpx.Response:
    response = httpx.post(f"{router.url}/v1/completions", json=body, timeout=60)
    response.raise_for_status()
    return response


def choice(router: Process, body: dict) -> str:
    """The engine `router` would send `body` to (`POST /fleet/route`)."""
    response = httpx.post(f"{router.url}/fleet/route", json=body, headers=AUTH, timeout=30)
    response.raise_for_status()
    return response.json()["url"]


class Load:
    """`NUM_CLIENTS` threads sending family requests through `routers` in turn (a round-robin
    balancer) until stopped; `measure` has each ask every router in `asked` first."""

    def __init__(self, families: Families, routers: list[Process]) -> None:
        self.families = families
        self.routers = routers
        self.asked: list[Process] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.num_sent = 0
        self.num_measured = 0  # requests taken to be measured
        self.num_asked = 0  # of those, the ones both routers have answered
        self.num_agreed = 0
        self.chosen: Counter[str] = Counter()  # the first asked router's choices
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._client, args=(n,), daemon=True)
            for n in range(NUM_CLIENTS)
        ]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)
        if self.errors and exc[0] is None:
            raise self.errors[0]

    def _client(self, number: int) -> None:
        draw = random.Random(number)
        question = 0
        while not self.stopping.is_set():
            question += 1
            body = self.families.body(draw.randrange(NUM_FAMILIES), 1000 * number + question)
            try:
                self._one(body)
            except BaseException as exc:  # noqa: BLE001 - raised by `__exit__`
                self.errors.append(exc)
                return

    def _one(self, body: dict) -> None:
        with self.lock:
            measured = bool(self.asked) and self.num_measured < NUM_MEASURED
            if measured:
                self.num_measured += 1
            router = self.routers[self.num_sent % len(self.routers)]
            self.num_sent += 1
        if measured:
            chosen = [choice(asked, body) for asked in self.asked]
            with self.lock:
                self.num_asked += 1
                self.num_agreed += len(set(chosen)) == 1
                self.chosen[chosen[0]] += 1
        send(router, body)

    def measure(self, asked: list[Process]) -> float:
        """The share of `NUM_MEASURED` requests on which every router in `asked` agreed. The
        choices must span every engine: one engine for all would agree trivially."""
        self.asked = asked
        wait_for(
            "the measured requests", lambda: self.num_asked >= NUM_MEASURED or self.errors, 180
        )
        if self.errors:
            raise self.errors[0]
        assert len(self.chosen) == len(ENGINE_IDS), self.chosen
        return self.num_agreed / NUM_MEASURED


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("router-restart")


@pytest.fixture(scope="module")
def engines(log_dir: Path) -> Iterator[list[Process]]:
    started = [start_engine(log_dir, name) for name in ENGINE_IDS]
    with running(*started) as ready:
        yield ready


def start_families(families: Families, router: Process) -> None:
    """Each family's first request, one at a time: every family then has a home."""
    for number in range(NUM_FAMILIES):
        send(router, families.body(number, 0))


def status(router: Process) -> str:
    try:
        return fleet(router)["status"]
    except httpx.HTTPError:
        return "unreachable"


def test_a_router_killed_under_load_agrees_with_one_that_never_stopped(
    engines: list[Process], log_dir: Path
) -> None:
    """Load through router A; router B is SIGKILLed mid-load and started again on its port.
    Once its `/fleet` says `ready`, the two routers choose the same engine for >= 95% of the
    requests that follow (asked before each is sent through A)."""
    families = Families(seed=1)
    with running(
        start_router(log_dir, engines, name="router-a"),
        start_router(log_dir, engines, name="router-b"),
    ) as (a, b):
        start_families(families, a)
        with Load(families, [a]) as load:
            wait_for("load through router A", lambda: load.num_sent >= 20, 60)
            b.kill()
            again = start_router(log_dir, engines, port=b.port, name="router-b-again", wait=False)
            try:
                wait_for("router B's /fleet to say ready", lambda: status(again) == "ready", 30)
                view = fleet(again)
                assert view["waiting_for"] == [] and view["degraded_since"] is None, view
                assert view["ready_after_s"] is not None, view
                print(f"router B ready {view['ready_after_s']:.3f} s after its start")
                agreed = load.measure([a, again])
            finally:
                again.stop()
        print(f"agreement after the restart: {agreed:.3f} over {NUM_MEASURED} requests")
        assert agreed >= AGREEMENT


def test_two_routers_behind_a_balancer_agree(engines: list[Process], log_dir: Path) -> None:
    """Load sent to two routers in turn (a round-robin balancer): each request's body is first
    put to both routers' `POST /fleet/route`; they name the same engine for >= 95% of them."""
    families = Families(seed=2)
    with running(
        start_router(log_dir, engines, name="balanced-a"),
        start_router(log_dir, engines, name="balanced-b"),
    ) as (a, b):
        start_families(families, a)
        with Load(families, [a, b]) as load:
            agreed = load.measure([a, b])
        print(f"agreement behind the balancer: {agreed:.3f} over {NUM_MEASURED} requests")
        assert agreed >= AGREEMENT


def test_a_router_started_while_an_engine_is_frozen_routes_degraded(
    engines: list[Process], log_dir: Path
) -> None:
    """Engine e2 is frozen (SIGSTOP) when the router starts: the router serves by e0 and e1,
    its `/fleet` says `degraded` naming e2, its answers say `X-Junction-Fleet: degraded`, and
    once e2 runs again (SIGCONT) its `/fleet` says `ready` with nothing waited for."""
    frozen = engines[2]
    os.kill(frozen.process.pid, signal.SIGSTOP)
    try:
        router = start_router(log_dir, engines, name="router-frozen")
        with running(router):
            view = fleet(router)
            assert view["status"] == "degraded", view
            assert [w["url"] for w in view["waiting_for"]] == [frozen.url], view
            assert view["waiting_for"][0]["status"] in ("connecting", "down"), view
            assert view["degraded_since"] is not None and view["ready_after_s"] is None, view
            health = httpx.get(f"{router.url}/health", timeout=5).json()
            assert health["fleet"] == "degraded" and health["num_up"] == 2, health
            answer = send(router, Families(seed=3).body(0, 0))
            assert answer.headers["x-junction-fleet"] == "degraded"
            assert answer.headers["x-junction-engine"] != frozen.url
            os.kill(frozen.process.pid, signal.SIGCONT)
            wait_for("the router's /fleet to say ready", lambda: status(router) == "ready", 30)
            view = fleet(router)
            assert view["waiting_for"] == [] and view["ready_after_s"] is not None, view
            answer = send(router, Families(seed=3).body(1, 0))
            assert "x-junction-fleet" not in answer.headers
        assert "routing degraded" in router.log.read_text()
        assert "every engine is in" in router.log.read_text()
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)
