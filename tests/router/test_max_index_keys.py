"""`junction route --max-index-keys` as an operator sees it: an engine whose feed announces
more keys is shown down in `GET /fleet`, the reason naming the setting, while an engine within
it serves. The engines are stand-in feeds (a hello, a snapshot, then heartbeats) on ports the
OS chose; nothing is sent to them but the feed's connection."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from engine.cache.lookup import HitGeometry
from engine.feed import FeedHeartbeat, FeedHello, FeedLoad, FeedSnapshot, encode
from engine.hashing import hash_prefix
from tests.api.processes import free_port
from tests.polling import wait_for
from tests.router.processes import Process, fleet, junction

TOKEN = "router-token-0123456789"
GEOMETRY = HitGeometry(16, 16, 16, 0, True, True)
LOAD = FeedLoad(0, 0, 0, 0.0, 0.0)


@contextmanager
def stand_in_feed(engine_id: str, num_units: int) -> Iterator[str]:
    """A cache feed announcing `num_units` units in both groups (2 keys a unit); yields its
    engine URL."""
    keys = hash_prefix(list(range(16 * num_units)), 16)
    stop = threading.Event()

    def handler(socket: ServerConnection) -> None:
        try:
            socket.send(encode(FeedHello(engine_id, 0, GEOMETRY, "m", 4096)))
            socket.send(encode(FeedSnapshot(0, keys, keys, LOAD)))
            while not stop.wait(0.2):
                socket.send(encode(FeedHeartbeat(0, LOAD)))
        except ConnectionClosed:
            pass

    with serve(handler, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        port = server.socket.getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop.set()
            server.shutdown()
            thread.join(10)


def test_an_engine_over_the_key_limit_is_down_naming_the_setting(tmp_path: Path) -> None:
    with ExitStack() as stack:
        within = stack.enter_context(stand_in_feed("within", 2))  # 4 keys
        over = stack.enter_context(stand_in_feed("over", 3))  # 6 keys
        port = free_port()
        args = ["route", "--port", str(port), "--log-level", "warning", "--max-index-keys", "5"]
        args += ["--engine", within, "--engine", over]
        log = tmp_path / "router.log"
        router = Process(
            "junction route", junction(*args, log=log, JUNCTION_API_TOKEN=TOKEN), port, log
        )
        try:
            router.wait_healthy()

            shown: dict[str, dict] = {}

            def over_down_within_up() -> bool:
                shown.update({e["url"]: e for e in fleet(router)["engines"]})
                reason = shown[over]["down_reason"] or ""
                return "--max-index-keys" in reason and shown[within]["status"] == "up"

            wait_for("the engine over the limit down, the other up", over_down_within_up, 30)
            assert shown[over]["status"] == "down"
            assert "6 keys" in shown[over]["down_reason"], shown[over]
        finally:
            router.stop()


def test_a_feed_frame_over_the_bound_is_not_read(tmp_path: Path) -> None:
    """Feed frames are bounded by `--max-index-keys` (issue 47, item 8): a snapshot of 40,000
    units (160,000 keys, 2.9 MB) against a limit of 5 keys (a 1 MiB frame) closes that
    engine's connection unread, its reason naming the setting; the other engine serves."""
    with ExitStack() as stack:
        within = stack.enter_context(stand_in_feed("within", 2))
        huge = stack.enter_context(stand_in_feed("huge", 40_000))
        port = free_port()
        args = ["route", "--port", str(port), "--log-level", "warning", "--max-index-keys", "5"]
        args += ["--engine", within, "--engine", huge]
        log = tmp_path / "router.log"
        router = Process(
            "junction route", junction(*args, log=log, JUNCTION_API_TOKEN=TOKEN), port, log
        )
        try:
            router.wait_healthy()
            shown: dict[str, dict] = {}

            def huge_down_within_up() -> bool:
                shown.update({e["url"]: e for e in fleet(router)["engines"]})
                reason = shown[huge]["down_reason"] or ""
                return "frame over" in reason and shown[within]["status"] == "up"

            wait_for("the engine with the huge frame down, the other up", huge_down_within_up, 30)
            assert "--max-index-keys" in shown[huge]["down_reason"], shown[huge]
        finally:
            router.stop()
