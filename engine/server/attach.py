"""`junction attach vllm|sglang`: a vLLM or SGLang engine's KV-cache events, bridged to the
control plane as a hash-keyed engine (`engine.bridge` decodes and translates them).

    junction attach vllm --events tcp://HOST:5557 [--replay tcp://HOST:5558] [--ranks N]
        [--metrics http://HOST:8000/metrics] --engine-id ID --control-plane URL --token T

Rank r's sockets are the given ports plus r (as vLLM and SGLang offset them). The events go
through the engine's own publisher machinery (`Outbox`, `PublisherLink`): hello (geometry
`{"kind", "physical_block_ids": false, "ranks", "events", "replay", "metrics"}`), batches with
seq, acks, resend after a reconnect, the bounded outbox. When the outbox overflows, or the
store lost batches it no longer holds, the bridge sends an empty snapshot and then its whole
table again (`PeerTable.events`), so the store's guarantees hold end to end. A bridge start is
a new epoch: the store drops the old table, and the replay (asked from seq 0) rebuilds it.

Progress: a log line every `--log-every` seconds, and the bridge's Prometheus metrics on
`--metrics-port` (`junction_bridge_*`; 0 turns them off).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from typing import TYPE_CHECKING

from engine.events import PeerMetrics, PeerResync
from engine.server.outbox import Outbox
from engine.server.streaming import add_control_plane_options

if TYPE_CHECKING:
    from engine.bridge.bridge import Bridge
    from engine.events import CacheEvent

log = logging.getLogger("engine.bridge")

TABLE_EVENTS_PER_BATCH = 5000


class Forwarder:
    """The bridge's sink, on the bridge's thread: events into the outbox as batches; the
    whole table again when the outbox asks for a snapshot."""

    def __init__(
        self, bridge: Bridge, outbox: Outbox, engine_id: str, epoch: int, scraper=None
    ) -> None:
        self.bridge, self.outbox = bridge, outbox
        self.engine_id, self.epoch = engine_id, epoch
        self.scraper = scraper

    def __call__(self, events: list[CacheEvent]) -> None:
        from engine.wire import Batch

        if self.scraper is not None:
            events = [*self.scraper.take(), *events]
        if self.outbox.needs_snapshot:
            self.resend_table()
        if not events:
            return
        ts = time.time()
        put = self.outbox.put_batch(
            lambda seq: Batch(
                engine_id=self.engine_id, epoch=self.epoch, seq=seq, ts=ts, events=events
            )
        )
        if put:
            self.bridge.stats.forwarded.inc(len(events))
            return
        # the outbox is full: the table holds these events' effect on the blocks; what it
        # cannot hold (resyncs, metric samples) goes after it
        log.log(
            logging.WARNING if self.outbox.overflowed() else logging.DEBUG,
            "event outbox full (%d frames unacknowledged): sending the table again instead",
            self.outbox.num_buffered,
        )
        self.resend_table()
        kept = [e for e in events if type(e) in (PeerResync, PeerMetrics)]
        if kept:
            self.outbox.put_batch(
                lambda seq: Batch(
                    engine_id=self.engine_id, epoch=self.epoch, seq=seq, ts=ts, events=kept
                )
            )

    def resend_table(self) -> None:
        from engine.wire import Batch, Snapshot

        ts, ranks = time.time(), self.bridge.ranks
        self.outbox.put_snapshot(
            lambda seq, requests: Snapshot(
                engine_id=self.engine_id,
                epoch=self.epoch,
                seq=seq,
                ts=ts,
                blocks=[],
                requests=requests,
                num_batches_dropped=self.outbox.num_dropped,
            )
        )
        events = self.bridge.table.events(ranks)
        self.bridge.stats.table_resends.inc()
        log.warning("sending the whole table again: %d hashes", len(events) - len(ranks))
        for start in range(0, len(events), TABLE_EVENTS_PER_BATCH):
            chunk = events[start : start + TABLE_EVENTS_PER_BATCH]
            put = self.outbox.put_batch(
                lambda seq, chunk=chunk: Batch(
                    engine_id=self.engine_id, epoch=self.epoch, seq=seq, ts=ts, events=chunk
                )
            )
            if not put:
                log.error("the table does not fit the outbox (raise --outbox-bytes); trying again")
                return


def add_attach_parser(commands: argparse._SubParsersAction) -> None:
    attach = commands.add_parser(
        "attach", help="bridge a vLLM or SGLang engine's KV-cache events to the control plane"
    )
    kinds = attach.add_subparsers(dest="peer", required=True)
    for kind in ("vllm", "sglang"):
        parser = kinds.add_parser(kind, help=f"{kind}'s ZeroMQ KV events (--kv-events-config)")
        parser.add_argument("--events", required=True, help="rank 0's PUB: tcp://HOST:PORT")
        parser.add_argument("--replay", default=None, help="rank 0's replay: tcp://HOST:PORT")
        parser.add_argument("--ranks", type=int, default=1, help="data-parallel ranks")
        parser.add_argument("--metrics", default=None, help="the peer's Prometheus URL")
        parser.add_argument("--metrics-interval", type=float, default=5.0, metavar="S")
        parser.add_argument("--model-name", default=None, help="(default: the engine id)")
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=9400,
            help="serve the bridge's own metrics here (0: off)",
        )
        parser.add_argument("--metrics-host", default="127.0.0.1")
        parser.add_argument(
            "--hwm",
            type=int,
            default=100_000,
            help="live messages queued per rank before the peer drops",
        )
        parser.add_argument("--replay-timeout", type=float, default=2.0, metavar="S")
        parser.add_argument("--log-every", type=float, default=30.0, metavar="S")
        parser.add_argument(
            "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
        )
        # test hook: drop live messages RANK:FIRST-LAST (inclusive) as if ZeroMQ lost them
        parser.add_argument("--drop-seqs", action="append", default=[], help=argparse.SUPPRESS)
        add_control_plane_options(parser)
        parser.set_defaults(func=cmd_attach, flavor=kind)


def _drop_hook(specs: list[str]):
    ranges = []
    for spec in specs:
        rank, _, seqs = spec.partition(":")
        first, _, last = seqs.partition("-")
        ranges.append((int(rank), int(first), int(last or first)))
    if not ranges:
        return None
    return lambda rank, seq: any(r == rank and a <= seq <= b for r, a, b in ranges)


def cmd_attach(args: argparse.Namespace) -> int:
    from engine.bridge.bridge import Bridge, BridgeConfig
    from engine.bridge.stats import BridgeStats
    from engine.server.peer_scrape import PeerScraper
    from engine.server.publisher_link import Backoff, PublisherLink, ingest_url
    from engine.wire import SCHEMA_VERSION, Hello

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    name = f"junction attach {args.flavor}"
    if not args.control_plane or not args.token:
        print(
            f"{name}: --control-plane and --token (or JUNCTION_API_TOKEN) are required",
            file=sys.stderr,
        )
        return 2
    try:
        config = BridgeConfig(
            events=args.events,
            replay=args.replay,
            num_ranks=args.ranks,
            flavor=args.flavor,
            hwm=args.hwm,
            replay_timeout_s=args.replay_timeout,
        )
        url = ingest_url(args.control_plane)
        drop = _drop_hook(args.drop_seqs)
        outbox = Outbox(args.outbox_batches, args.outbox_bytes)
    except ValueError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    stats = BridgeStats()
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, args.metrics_host, registry=stats.registry)
    epoch = time.time_ns()
    hello = Hello(
        version=SCHEMA_VERSION,
        engine_id=args.engine_id,
        epoch=epoch,
        geometry={
            "kind": args.flavor,
            "physical_block_ids": False,
            "ranks": list(range(args.ranks)),
            "events": args.events,
            "replay": args.replay,
            "metrics": args.metrics,
        },
        model={"name": args.model_name or args.engine_id, "source": args.flavor},
    )
    scraper = None
    if args.metrics:
        scraper = PeerScraper(args.metrics, args.flavor, stats, args.metrics_interval)
    bridge = Bridge(config, lambda events: None, stats, drop)
    bridge.sink = Forwarder(bridge, outbox, args.engine_id, epoch, scraper)
    link = PublisherLink(
        outbox,
        url,
        args.token,
        hello,
        binary=True,
        backoff=Backoff(),
        open_timeout_s=5.0,
        max_frame_bytes=outbox.max_frame_bytes,
        on_command=lambda c: log.info("ignoring the control plane's %s command", c.command),
    )
    signal.signal(signal.SIGTERM, lambda *_: bridge.stopping.set())
    link.start()
    if scraper is not None:
        scraper.start()
    try:
        bridge.open()
        last_log = time.monotonic()
        while not bridge.stopping.is_set():
            bridge.run_once()
            stats.outbox_frames.set(outbox.num_buffered)
            stats.connected.set(int(link.is_connected))
            if time.monotonic() - last_log >= args.log_every:
                last_log = time.monotonic()
                _log_progress(bridge, outbox, link)
    except KeyboardInterrupt:
        pass
    finally:
        _log_progress(bridge, outbox, link)
        bridge.close()
        if scraper is not None:
            scraper.stop()
        link.stop(5.0)
    return 0


def _log_progress(bridge: Bridge, outbox: Outbox, link) -> None:
    s = bridge.stats
    total = {
        name: sum(m.value for m in metric.collect()[0].samples if m.name.endswith("_total"))
        for name, metric in (
            ("batches", s.batches),
            ("events", s.events),
            ("gaps", s.gaps),
            ("resyncs", s.resyncs),
            ("bad", s.bad_frames),
        )
    }
    log.info(
        "bridge: %d batches, %d events, %d gaps, %d resyncs, %d bad inputs; next seq %s; "
        "%d hashes; outbox %d frames; %s",
        total["batches"],
        total["events"],
        total["gaps"],
        total["resyncs"],
        total["bad"],
        [st.next_seq for st in bridge.streams],
        len(bridge.table.entries),
        outbox.num_buffered,
        "connected" if link.is_connected else f"not connected ({link.last_error or 'yet'})",
    )
