"""`junction attach`'s face: the forwarder into the publisher's outbox (the table sent again
when the outbox overflows), the peer's metrics parsed, and the command line."""

from __future__ import annotations

import msgspec

from attach.bridge.bridge import Bridge, BridgeConfig, rank_endpoint
from attach.cli import Forwarder
from attach.peer_scrape import parse_metrics
from cli.main import build_parser
from engine.events import PeerBlockStored, PeerCacheCleared, PeerMetrics
from engine.wire import Batch, Snapshot, decode
from publish.outbox import Outbox

VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 300.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 800.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
"""
SGLANG_METRICS = """\
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 4096.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="m",cache_source="device"} 3000.0
sglang:cached_tokens_total{model_name="m",cache_source="host"} 168.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.28
"""


def test_vllm_metrics_per_rank() -> None:
    assert parse_metrics(VLLM_METRICS, "vllm", 7.0) == [
        PeerMetrics(rank=0, scraped_ts=7.0, queries_tokens=1200, hits_tokens=800, usage=0.25),
        PeerMetrics(rank=1, scraped_ts=7.0, queries_tokens=300, hits_tokens=0, usage=0.5),
    ]


def test_sglang_metrics_sum_the_cache_sources() -> None:
    (metrics,) = parse_metrics(SGLANG_METRICS, "sglang", 1.0)
    assert (metrics.queries_tokens, metrics.hits_tokens, metrics.usage) == (4096, 3168, 0.28)


def test_a_page_without_the_counters_gives_nothing() -> None:
    assert parse_metrics("# TYPE x counter\nx_total 1\n", "vllm", 1.0) == []


def test_rank_endpoints_offset_the_port() -> None:
    assert rank_endpoint("tcp://10.0.0.1:5557", 0) == "tcp://10.0.0.1:5557"
    assert rank_endpoint("tcp://10.0.0.1:5557", 3) == "tcp://10.0.0.1:5560"
    assert rank_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"


def _stored(h: str) -> PeerBlockStored:
    return PeerBlockStored(
        rank=0,
        group_idx=0,
        group="attention",
        medium="GPU",
        block_hashes=[h],
        parent_block_hash=None,
        block_size=1,
        token_ids=[1],
    )


def test_an_overflowing_outbox_gives_way_to_the_whole_table() -> None:
    bridge = Bridge(BridgeConfig(events="tcp://127.0.0.1:1", num_ranks=2), lambda e: None)
    outbox = Outbox(max_batches=2)
    forward = Forwarder(bridge, outbox, "peer-1", 5)
    for h in ("01", "02", "03"):
        event = _stored(h)
        bridge.table.stored(event)  # as `translate` does before the event is emitted
        forward([event])
    assert bridge.stats.value("junction_bridge_table_resends_total") == 1
    frames = []
    while outbox.num_buffered:
        frame = outbox.take(lambda: False, may_ask=False)
        frames += [decode(p) for p in frame.encoded(False)]
        outbox.ack(frame.seq)
    snapshot, table = frames
    assert isinstance(snapshot, Snapshot) and snapshot.blocks == [] and snapshot.seq == 2
    assert isinstance(table, Batch) and table.seq == 3 and table.epoch == 5
    assert table.events[:2] == [PeerCacheCleared(rank=0), PeerCacheCleared(rank=1)]
    assert [e.block_hashes[0] for e in table.events[2:]] == ["01", "02", "03"]


def test_a_store_that_lost_batches_gets_the_table_at_the_next_round() -> None:
    bridge = Bridge(BridgeConfig(events="tcp://127.0.0.1:1"), lambda e: None)
    outbox = Outbox()
    forward = Forwarder(bridge, outbox, "peer-1", 5)
    bridge.table.stored(_stored("0a"))
    outbox.ask_snapshot()
    forward([])  # the bridge's idle round
    assert outbox.num_buffered == 2 and not outbox.needs_snapshot


def test_the_command_line() -> None:
    args = build_parser().parse_args(
        [
            "attach",
            "sglang",
            "--events",
            "tcp://h:5557",
            "--replay",
            "tcp://h:5558",
            "--ranks",
            "2",
            "--engine-id",
            "sg-1",
            "--drop-seqs",
            "0:3-5",
        ]
    )
    assert (args.command, args.peer, args.flavor, args.ranks) == ("attach", "sglang", "sglang", 2)
    assert msgspec.json.encode(args.drop_seqs) == b'["0:3-5"]'


def test_the_scraper_reads_the_peer_and_survives_it_going_away(caplog) -> None:
    import http.server
    import logging
    import threading

    from attach.bridge.stats import BridgeStats
    from attach.peer_scrape import PeerScraper
    from tests.polling import wait_until

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = VLLM_METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stats = BridgeStats()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    scraper = PeerScraper(url, "vllm", stats, interval_s=0.05)
    scraper.start()
    try:
        taken: list = []
        assert wait_until(lambda: taken.extend(scraper.take()) or len(taken) >= 2, 10)
        assert {m.rank for m in taken} == {0, 1}
        server.shutdown()
        server.server_close()
        with caplog.at_level(logging.WARNING, "attach.bridge"):
            assert wait_until(
                lambda: stats.value("junction_bridge_scrapes_total", outcome="error") >= 1, 10
            )
        assert f"metrics {url}: " in caplog.text  # ConnectError, or a reset keep-alive
    finally:
        scraper.stop()


def _huge(h: str, parent: str | None, num_tokens: int) -> PeerBlockStored:
    return PeerBlockStored(
        rank=0,
        group_idx=1,
        group="mamba",
        medium="GPU",
        block_hashes=[h],
        parent_block_hash=parent,
        block_size=num_tokens,
        token_ids=[7] * num_tokens,
    )


def _drain(outbox: Outbox) -> list:
    frames = []
    while outbox.num_buffered:
        frame = outbox.take(lambda: False, may_ask=False)
        for payload in frame.encoded(True, outbox.max_frame_bytes):
            assert len(payload) <= outbox.max_frame_bytes
            frames.append(decode(payload))
        outbox.ack(frame.seq)
    return frames


def test_a_batch_larger_than_a_frame_goes_in_frames_and_the_table_too() -> None:
    """Three stored events of 2^20 token ids each (issue 31: the bridge then resent its table
    four times a second for good, each too large for a frame)."""
    bridge = Bridge(BridgeConfig(events="tcp://127.0.0.1:1"), lambda e: None)
    outbox = Outbox(binary=True)
    forward = Forwarder(bridge, outbox, "peer-1", 5)
    events = [_huge("0a", None, 1 << 20), _huge("0b", "0a", 1 << 20), _huge("0c", "0b", 1 << 20)]
    for event in events:
        bridge.table.stored(event)
    forward(events)
    assert not outbox.needs_snapshot
    assert bridge.stats.value("junction_bridge_table_resends_total") == 0
    batches = _drain(outbox)
    assert len(batches) == 3 and [e for b in batches for e in b.events] == events
    forward.resend_table()  # the table's events are cut to frames as well
    snapshot, *table = _drain(outbox)
    assert isinstance(snapshot, Snapshot) and len(table) == 3
    assert [e.block_hashes for b in table for e in b.events[1:] or b.events] == [
        ["0a"],
        ["0b"],
        ["0c"],
    ]


def test_an_event_larger_than_a_frame_alone_goes_without_its_token_ids(caplog) -> None:
    bridge = Bridge(BridgeConfig(events="tcp://127.0.0.1:1"), lambda e: None)
    outbox = Outbox(binary=True, max_frame_bytes=1 << 20)
    event = _huge("0a", None, 1 << 20)
    Forwarder(bridge, outbox, "peer-1", 5)([event, _stored("0b")])
    (batch,) = _drain(outbox)
    assert batch.events == [msgspec.structs.replace(event, token_ids=[]), _stored("0b")]
    assert "is larger than a batch may be" in caplog.text
    assert "frame limit): forwarded without its token ids" in caplog.text
