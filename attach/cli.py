"""`junction attach vllm|sglang`: a vLLM or SGLang engine's KV-cache events, bridged in as a
hash-keyed engine (`attach.bridge` decodes and translates them), to the control plane, to a
cache feed that `junction route` follows, or both.

    junction attach vllm --events tcp://HOST:5557 [--replay tcp://HOST:5558] [--ranks N]
        [--metrics http://HOST:8000/metrics] --engine-id ID --token T
        [--control-plane URL]
        [--feed-port PORT [--feed-host H] --serve-url http://HOST:8000 --served-model NAME]

Rank r's sockets are the given ports plus r (as vLLM and SGLang offset them). To the control
plane the events go through the engine's own publisher machinery (`attach_forward.py`). The
cache feed (`attach_feed.py`) serves `WS /v1/cache/feed` as an engine does, its keys Junction's
hashes of the peer's blocks (`attach.bridge.feed_keys`), so a router scores the peer like an
engine and sends its requests to `--serve-url`.

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

from attach.attach_feed import add_feed_options, check_feed_options, log_feed, open_feed
from attach.attach_forward import Forwarder, control_plane_link
from publish.streaming import add_control_plane_options

if TYPE_CHECKING:
    from attach.bridge.bridge import Bridge, BridgeConfig
    from attach.bridge.peer_feed import PeerFeed
    from attach.bridge.prefixes import PeerPrefixes
    from engine.events import CacheEvent

log = logging.getLogger("attach.bridge")


def add_attach_parser(commands: argparse._SubParsersAction) -> None:
    attach = commands.add_parser(
        "attach",
        help="bridge a vLLM or SGLang engine's KV-cache events to the control plane or to routers",
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
        add_feed_options(parser)
        parser.add_argument(
            "--recording-out",
            metavar="FILE",
            help="rebuild the peer's request prefixes from its stored blocks and write them "
            "here as a what-if recording (`junction whatif --recording FILE`), every "
            "--log-every seconds and at exit",
        )
        parser.add_argument(
            "--recording-unit",
            type=int,
            default=16,
            metavar="TOKENS",
            help="the match unit the recording hashes at (must divide the peer's block size)",
        )
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


class Fanout:
    """The bridge's sink: the scraped metrics joined to each batch, then the whole batch to
    the control plane's forwarder and to the cache feed, each where there is one."""

    def __init__(
        self,
        scraper=None,
        forwarder: Forwarder | None = None,
        feed: PeerFeed | None = None,
        prefixes: PeerPrefixes | None = None,
    ) -> None:
        self.scraper, self.forwarder, self.feed = scraper, forwarder, feed
        self.prefixes = prefixes

    def __call__(self, events: list[CacheEvent]) -> None:
        if self.scraper is not None:
            events = [*self.scraper.take(), *events]
        if self.prefixes is not None:
            self.prefixes.apply(events)
        if self.feed is not None:
            self.feed.on_events(events)
        if self.forwarder is not None:
            self.forwarder(events)


def _check(args: argparse.Namespace) -> BridgeConfig:
    """The bridge's config from the options; `ValueError` naming what is wrong."""
    from attach.bridge.bridge import BridgeConfig

    if not args.token and (args.control_plane or args.feed_port is not None):
        raise ValueError("--token (or JUNCTION_API_TOKEN) is required")
    if not args.control_plane and args.feed_port is None and not args.recording_out:
        raise ValueError(
            "--control-plane (or JUNCTION_CONTROL_PLANE_URL), --feed-port or --recording-out "
            "is required: somewhere for the peer's cache to go"
        )
    check_feed_options(args)
    return BridgeConfig(
        events=args.events,
        replay=args.replay,
        num_ranks=args.ranks,
        flavor=args.flavor,
        hwm=args.hwm,
        replay_timeout_s=args.replay_timeout,
    )


def cmd_attach(args: argparse.Namespace) -> int:
    from attach.bridge.bridge import Bridge
    from attach.bridge.stats import BridgeStats
    from attach.peer_scrape import PeerScraper

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        bridge = Bridge(
            _check(args), lambda events: None, BridgeStats(), _drop_hook(args.drop_seqs)
        )
        forwarder = link = feed = server = None
        if args.control_plane:
            forwarder, link = control_plane_link(args, bridge, time.time_ns())
        if args.feed_port is not None:
            feed, server = open_feed(args, bridge)
        prefixes = None
        if args.recording_out:
            from attach.bridge.prefixes import PeerPrefixes

            prefixes = PeerPrefixes(args.recording_unit)
    except (ValueError, OSError) as exc:
        print(f"junction attach {args.flavor}: {exc}", file=sys.stderr)
        return 2
    stats = bridge.stats
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, args.metrics_host, registry=stats.registry)
    scraper = None
    if args.metrics:
        scraper = PeerScraper(args.metrics, args.flavor, stats, args.metrics_interval)
    bridge.sink = Fanout(scraper, forwarder, feed, prefixes)
    signal.signal(signal.SIGTERM, lambda *_: bridge.stopping.set())
    for part in (link, scraper):
        if part is not None:
            part.start()
    try:
        bridge.open()
        last_log = time.monotonic()
        while not bridge.stopping.is_set():
            bridge.run_once()
            if link is not None:
                stats.outbox_frames.set(forwarder.outbox.num_buffered)
                stats.connected.set(int(link.is_connected))
            if time.monotonic() - last_log >= args.log_every:
                last_log = time.monotonic()
                _log_progress(bridge, forwarder, link, feed)
                _write_recording(args, prefixes)
    except KeyboardInterrupt:
        pass
    finally:
        _log_progress(bridge, forwarder, link, feed)
        _write_recording(args, prefixes)
        bridge.close()
        if scraper is not None:
            scraper.stop()
        if link is not None:
            link.stop(5.0)
        if server is not None:
            server.stop()
    return 0


def _write_recording(args: argparse.Namespace, prefixes: PeerPrefixes | None) -> None:
    """The prefixes rebuilt so far, whole, at `--recording-out` (a failed write is logged)."""
    if prefixes is None:
        return
    from engine.traces.replay import write_atomically
    from whatif.recording import dump_lines

    recording = prefixes.recording(args.flavor)
    try:
        write_atomically(
            args.recording_out, (line.decode() + "\n" for line in dump_lines(recording))
        )
    except OSError as exc:
        log.warning("could not write the recording to %s: %s", args.recording_out, exc)
        return
    log.info(
        "recording: %d request prefixes at %s (%d stored events left out)",
        prefixes.num_prefixes,
        args.recording_out,
        prefixes.num_skipped,
    )


def _log_progress(bridge: Bridge, forwarder: Forwarder | None, link, feed) -> None:
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
        "bridge: %d batches, %d events, %d gaps, %d resyncs, %d bad inputs; next seq %s; %d hashes",
        total["batches"],
        total["events"],
        total["gaps"],
        total["resyncs"],
        total["bad"],
        [st.next_seq for st in bridge.streams],
        len(bridge.table.entries),
    )
    if link is not None:
        log.info(
            "control plane: outbox %d frames; %s",
            forwarder.outbox.num_buffered,
            "connected" if link.is_connected else f"not connected ({link.last_error or 'yet'})",
        )
    if feed is not None:
        log_feed(feed)
