"""A cache feed that announces what no engine could (issue 47, item 4): a match unit of 0, of
2^40, sizes that do not divide, a negative seq, a NaN load, a request limit of 2^62. Each such
engine is taken out of the fleet with a reason naming the field, and the router goes on serving
every request through the healthy engine beside them; before, one engine announcing a match
unit of 0 made the router answer 500 (a `ZeroDivisionError` hashing for every up engine).

The bad engines are stand-in feeds (a hello, a snapshot, then heartbeats, as raw msgpack) on
ports the OS chose; the healthy one is a real `junction serve`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import msgspec
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from tests.polling import wait_for
from tests.router.processes import fleet, running, start_engine, start_router

GEOMETRY = {
    "match_unit": 16,
    "attention_block_size": 16,
    "hit_alignment": 16,
    "eagle_drop": 0,
    "is_fine_grained": True,
    "enable_prefix_caching": True,
}
LOAD = [0, 0, 0, 0.0, 0.0]

#: name -> (what the hello says, what the first heartbeat says, a word its reason must name)
BAD = {
    "unit-zero": ({"geometry": {**GEOMETRY, "match_unit": 0}}, {}, "match_unit"),
    "unit-huge": ({"geometry": {**GEOMETRY, "match_unit": 1 << 40}}, {}, "match_unit"),
    "no-divide": ({"geometry": {**GEOMETRY, "hit_alignment": 24}}, {}, "hit_alignment"),
    "huge-limit": ({"max_request_tokens": 1 << 62}, {}, "max_request_tokens"),
    "negative-seq": ({}, {"seq": -3}, "seq"),
    "nan-load": ({}, {"load": [0, 0, 0, float("nan"), 0.0]}, "load"),
}


@contextmanager
def stand_in_feed(engine_id: str, hello: dict, heartbeat: dict) -> Iterator[str]:
    """A cache feed whose hello and heartbeats carry `hello` and `heartbeat` over valid
    frames; yields its engine URL."""
    stop = threading.Event()
    encode = msgspec.msgpack.encode

    def handler(socket: ServerConnection) -> None:
        try:
            socket.send(
                encode(
                    {
                        "type": "hello",
                        "engine_id": engine_id,
                        "epoch": 0,
                        "geometry": GEOMETRY,
                        "model": "m",
                        "max_request_tokens": 4096,
                        **hello,
                    }
                )
            )
            socket.send(
                encode({"type": "snapshot", "seq": 0, "attention": [], "mamba": [], "load": LOAD})
            )
            while not stop.wait(0.2):
                socket.send(encode({"type": "heartbeat", "seq": 0, "load": LOAD, **heartbeat}))
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


class Url:
    """What `start_router` needs of an engine: its URL."""

    def __init__(self, url: str) -> None:
        self.url = url


def test_bad_feeds_are_taken_out_and_the_healthy_engine_serves(tmp_path: Path) -> None:
    with ExitStack() as stack:
        bad = {
            name: stack.enter_context(stand_in_feed(name, hello, heartbeat))
            for name, (hello, heartbeat, _) in BAD.items()
        }
        with running(start_engine(tmp_path, "healthy", "--host-cache-bytes", "0")) as [good]:
            engines = [good, *(Url(url) for url in bad.values())]
            router = start_router(tmp_path, engines)  # type: ignore[arg-type]
            try:
                shown: dict[str, dict] = {}

                def all_bad_down() -> bool:
                    shown.update({e["url"]: e for e in fleet(router)["engines"]})
                    return all(shown.get(url, {}).get("status") == "down" for url in bad.values())

                wait_for("every bad feed's engine down", all_bad_down, 30)
                for name, url in bad.items():
                    reason = shown[url]["down_reason"] or ""
                    assert BAD[name][2] in reason, (name, reason)
                assert shown[good.url]["status"] == "up"
                client = router.client
                served = set()
                for index in range(12):
                    response = client.completions.with_raw_response.create(
                        model="junction-hybrid-tiny", prompt=f"question {index}", max_tokens=2
                    )
                    assert response.http_response.status_code == 200
                    served.add(
                        (
                            response.headers["x-junction-engine"],
                            response.headers["x-junction-engine-id"],
                        )
                    )
                assert served == {(good.url, "healthy")}
            finally:
                router.stop()
