"""`junction attach ... --feed-port PORT --serve-url URL --served-model NAME`: the options of
the peer's cache feed, their checks, and the feed opened (`attach.bridge.peer_feed` for the
keys, `peer_feed_server.py` for the socket). Loaded by the command line; the web library only
when a feed is asked for."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attach.bridge.bridge import Bridge
    from attach.bridge.peer_feed import PeerFeed
    from attach.peer_feed_server import PeerFeedServer

from engine.feed import add_send_timeout_option

log = logging.getLogger("attach.bridge")


def add_feed_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--feed-port",
        type=int,
        default=None,
        help="serve the peer's cache feed (WS /v1/cache/feed) on this port, for junction route "
        "(the --token is its bearer token)",
    )
    parser.add_argument("--feed-host", default="127.0.0.1")
    parser.add_argument(
        "--serve-url",
        default=None,
        metavar="URL",
        help="the peer's OpenAI base URL (http://host:port), where a router sends requests",
    )
    parser.add_argument(
        "--served-model",
        default=None,
        metavar="NAME",
        help="the model name the peer serves, as requests name it (default: --model-name)",
    )
    parser.add_argument(
        "--feed-rank", type=int, default=0, help="the data-parallel rank the feed announces"
    )
    add_send_timeout_option(parser)


def check_serve_url(url: str | None) -> str:
    """`--serve-url` without a trailing slash; `ValueError` saying what is wrong."""
    if not url:
        raise ValueError("--feed-port needs --serve-url (the peer's OpenAI base URL)")
    url = url.rstrip("/")
    scheme, _, rest = url.partition("://")
    if scheme not in ("http", "https") or not rest or "/" in rest:
        raise ValueError(
            f"--serve-url {url!r} is not an http(s)://host:port base URL (without /v1: the "
            "router adds the path the client asked for)"
        )
    return url


def check_feed_options(args: argparse.Namespace) -> None:
    """Normalise the feed's options in `args`; `ValueError` naming the wrong one."""
    if args.feed_port is None:
        return
    if not 0 <= args.feed_port <= 65535:
        raise ValueError(f"--feed-port {args.feed_port} is not a port")
    args.serve_url = check_serve_url(args.serve_url)
    args.served_model = args.served_model or args.model_name
    if not args.served_model:
        raise ValueError("--feed-port needs --served-model (the model name requests give)")
    if not 0 <= args.feed_rank < args.ranks:
        raise ValueError(f"--feed-rank {args.feed_rank} is not one of the {args.ranks} ranks")


def open_feed(args: argparse.Namespace, bridge: Bridge) -> tuple[PeerFeed, PeerFeedServer]:
    """The cache feed over the bridge's table, its server started (`OSError` when the port
    cannot be bound)."""
    from attach.bridge.peer_feed import PeerFeed
    from attach.peer_feed_server import PeerFeedServer

    feed = PeerFeed(
        args.engine_id,
        args.served_model,
        args.serve_url,
        bridge.table,
        rank=args.feed_rank,
        stats=bridge.stats,
    )
    server = PeerFeedServer(
        feed, args.token, args.feed_host, args.feed_port, args.feed_send_timeout
    )
    server.start()
    return feed, server


def log_feed(feed: PeerFeed) -> None:
    attention, mamba = map(len, feed.keys.held)
    if not feed.keys.has_states:
        mamba = attention  # no Mamba group: every attention block end is a resume point
    log.info(
        "cache feed: %d attention and %d mamba keys, %d blocks not keyed (parent unknown), "
        "%d routers following",
        attention,
        mamba,
        feed.keys.num_unkeyed,
        len(feed.subscribers),
    )
