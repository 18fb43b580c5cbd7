"""Reads wait their turn, bounded, so the ingest socket keeps its priority
(`api.guards.read_limit`)."""

from __future__ import annotations

import anyio
import httpx
import pytest

from api.guards.read_limit import ReadLimit
from api.settings import Settings


class SlowReads:
    """An ASGI app whose reads wait until `release` is set; counts those running at once."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.running = self.most = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["method"] == "GET" and scope["path"].startswith("/api/v1/"):
            self.running += 1
            self.most = max(self.most, self.running)
            await self.release.wait()
            self.running -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.mark.anyio
async def test_reads_beyond_the_cap_wait_and_past_the_queue_are_503():
    inner = SlowReads()
    settings = Settings(_env_file=None, max_concurrent_reads=2, max_waiting_reads=3)
    app = ReadLimit(inner, settings)
    answers: list[int] = []
    async with client(app) as http:

        async def read() -> None:
            answers.append((await http.get("/api/v1/engines")).status_code)

        async with anyio.create_task_group() as tasks:
            for _ in range(6):  # 2 run, 3 wait, 1 is turned away at once
                tasks.start_soon(read)
            with anyio.fail_after(10):
                while answers != [503]:
                    await anyio.sleep(0.01)
            # what the limit leaves alone answers while the reads are stuck
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.post("/api/v1/pins")).status_code == 200
            assert inner.running == 2
            inner.release.set()
    assert sorted(answers) == [200] * 5 + [503]
    assert inner.most == 2


@pytest.mark.anyio
async def test_a_read_that_waits_too_long_is_503_naming_the_settings():
    inner = SlowReads()
    settings = Settings(_env_file=None, max_concurrent_reads=1, read_wait_s=0.2)
    async with client(ReadLimit(inner, settings)) as http, anyio.create_task_group() as tasks:
        tasks.start_soon(http.get, "/api/v1/engines")
        await anyio.sleep(0.05)
        late = await http.get("/api/v1/requests")
        inner.release.set()
    assert late.status_code == 503 and late.headers["retry-after"] == "1"
    assert "JUNCTION_MAX_CONCURRENT_READS" in late.json()["detail"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class HeldPaths:
    """An ASGI app whose reads of `held` paths wait until `release` is set; the rest answer
    at once."""

    def __init__(self, *held: str) -> None:
        self.held = set(held)
        self.release = anyio.Event()
        self.num_held = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["path"] in self.held:
            self.num_held += 1
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.anyio
async def test_event_reads_never_wait_behind_other_reads():
    """One read slot, held by a block-table page, another page waiting: a consumer's
    `GET /api/v1/events` and `/healthz` are answered (within `read_wait_s`, or they would be
    503), not queued behind them."""
    inner = HeldPaths("/api/v1/engines/e/blocks")
    settings = Settings(_env_file=None, max_concurrent_reads=1, read_wait_s=0.5)
    async with client(ReadLimit(inner, settings)) as http, anyio.create_task_group() as tasks:
        for _ in range(2):
            tasks.start_soon(http.get, "/api/v1/engines/e/blocks")
        with anyio.fail_after(10):
            while inner.num_held < 1:
                await anyio.sleep(0.01)
        events = [await http.get("/api/v1/events", params={"after_seq": n}) for n in range(5)]
        health = await http.get("/healthz")
        inner.release.set()
    assert [answer.status_code for answer in events] == [200] * 5
    assert health.status_code == 200


@pytest.mark.anyio
async def test_event_reads_are_bounded_in_their_own_lane():
    inner = HeldPaths("/api/v1/events")
    settings = Settings(_env_file=None, max_concurrent_event_reads=1, read_wait_s=0.2)
    async with client(ReadLimit(inner, settings)) as http, anyio.create_task_group() as tasks:
        tasks.start_soon(http.get, "/api/v1/events")
        with anyio.fail_after(10):
            while inner.num_held < 1:
                await anyio.sleep(0.01)
        with anyio.fail_after(10):  # (one lane for every read: the late one is held too)
            late = await http.get("/api/v1/events")
            other = await http.get("/api/v1/engines")  # the other lane is free
        inner.release.set()
    assert late.status_code == 503 and "JUNCTION_MAX_CONCURRENT_EVENT_READS" in late.text
    assert other.status_code == 200
