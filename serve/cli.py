"""`junction serve`: the engine behind its OpenAI-compatible server.

`cli/main.py` registers it with `add_serve_parser(commands)`. Web libraries are imported
only when the command runs, so the rest of the command line stays light.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from engine.config import DEFAULT_SERVE_NUM_MAMBA_BLOCKS, TierConfig
from engine.feed import add_send_timeout_option
from engine.setup.options import (
    EXIT_BAD_INPUT,
    HOST_AUTO,
    add_cache_options,
    add_model_options,
    add_tier_options,
    configs_from_args,
    describe_tiers,
    tier_config_from_args,
)
from protocol.body_size import add_max_body_option
from protocol.connections.options import add_connection_options, bounds_from_args
from publish.streaming import (
    add_control_plane_options,
    connect,
    finish_publishing,
    make_publisher,
)
from sharedstore import add_shared_options, open_store, shared_config_from_args
from sharedstore import describe as describe_shared

if TYPE_CHECKING:
    from engine.tiers.tiering import TierCosts


def add_serve_parser(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="run the engine behind an OpenAI-compatible server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--serve-url",
        type=http_url,
        default=None,
        metavar="URL",
        help="where routers and the control plane's discovery reach this engine (default "
        "http://HOST:PORT; with --host 0.0.0.0 or ::, http://<this machine's hostname>:PORT)",
    )
    serve.add_argument(
        "--model-name",
        default=None,
        help="the model name clients must send (default: the --model directory's name, or "
        "junction-hybrid-tiny)",
    )
    add_max_body_option(serve)
    add_connection_options(serve)
    add_send_timeout_option(serve)
    add_control_plane_options(serve)
    serve.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )
    # a server runs the model: fewer Mamba slots keep the built-in's state pool small
    add_cache_options(serve, num_mamba_blocks=DEFAULT_SERVE_NUM_MAMBA_BLOCKS)
    add_tier_options(serve, host_default=HOST_AUTO)
    add_shared_options(serve)
    add_model_options(serve)
    serve.set_defaults(func=cmd_serve, runner="torch")


def http_url(value: str) -> str:
    """`--serve-url`'s check: an http(s)://host[:port] URL, without a trailing slash."""
    parts = urlsplit(value)
    try:
        port_ok = parts.port is None or parts.port > 0  # a port that is not a number raises
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok or parts.query:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s)://host:port URL")
    return value.rstrip("/")


def default_serve_url(host: str, port: int) -> str:
    """http://HOST:PORT, naming this machine instead of an address that means "every one"."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"http://{host}:{port}"


def check_port(host: str, port: int) -> None:
    """Raises `OSError` naming HOST:PORT when the server could not listen there (taken, not
    this machine's address), so that `serve` says so before it loads the model, not after."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OSError(
            f"cannot listen on {host}:{port}: {reason}; stop what holds it, or pick another "
            "--port (or --host)"
        ) from None


def describe_prices(costs: TierCosts, tiers: TierConfig) -> str:
    """The start-up line about what a tier load is priced at (`Engine.price_tier_loads`)."""
    disk = f", {costs.disk_bytes_per_s / 1e9:.1f} GB/s from disk" if tiers.disk_cache_dir else ""
    return (
        f"tier loads priced at {costs.host_bytes_per_s / 1e9:.1f} GB/s from host{disk}, "
        f"against a prefill of {costs.prefill_tokens_per_s:,.0f} tokens/s measured now (a load "
        "slower than its prefill is not taken)"
    )


def exit_on_sigterm(signum: int, frame: object) -> None:
    """uvicorn stops on SIGTERM, then raises the signal again for the handler there before it:
    the default one killed the process at that point, before the `finally` that flushes the
    events and says the feed's goodbye (1001), so the control plane held the engine id for
    `JUNCTION_ENGINE_LEASE_S` and a restart within it was refused as "in use" (issue 47, item
    15). This one exits through the `finally` instead, with code 0."""
    raise SystemExit(0)


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.model.hf.tokenizer import load_tokenizer
    from engine.setup.model_card import describe, model_card

    try:
        cache, scheduler, model = configs_from_args(args)
        bounds = bounds_from_args(args)
        tiers = tier_config_from_args(args, cache, model)
        shared = shared_config_from_args(args)
        check_port(args.host, args.port)  # before the model loads, which can take a while
        tokenizer = load_tokenizer(model.model_dir)
        serve_url = args.serve_url or default_serve_url(args.host, args.port)
        card = {**model_card(model, cache), "serve_url": serve_url}
    except (ValueError, OSError) as exc:
        print(f"junction serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    publisher = None
    if args.control_plane:
        publisher = make_publisher(args, card)
        if publisher is None:
            return EXIT_BAD_INPUT
    print(f"junction serve: {describe(card)}", file=sys.stderr, flush=True)
    print(f"junction serve: {describe_tiers(tiers)}", file=sys.stderr, flush=True)
    if shared is not None:
        print(f"junction serve: {describe_shared(shared)}", file=sys.stderr, flush=True)

    from engine.engine import Engine
    from engine.feed import FeedHub
    from serve.app import create_app
    from serve.async_engine import AsyncEngine
    from serve.diagnosis import DiagnosingSink, DiagnosisOracle

    try:
        # the sink keeps events for the publisher only when there is one to drain them
        feed = FeedHub()
        diagnosis = DiagnosisOracle()  # why each request missed, for those that ask
        sink = DiagnosingSink(feed, publisher is not None, diagnosis)
        engine = Engine(
            cache,
            scheduler,
            model,
            args.runner,
            sink,
            engine_id=args.engine_id,
            tiers=tiers,
            shared=None if shared is None else partial(open_store, shared),
        )
        costs = engine.price_tier_loads()
    except (ValueError, OSError) as exc:
        print(f"junction serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if costs is not None:
        print(f"junction serve: {describe_prices(costs, tiers)}", file=sys.stderr, flush=True)
    feed.attach(engine, model.name)
    diagnosis.attach(engine)
    async_engine = AsyncEngine(engine)
    if publisher is not None:
        # the listener runs on the engine loop's thread; `call` reaches it while it is idle
        connect(
            publisher,
            engine,
            tokenizer,
            wake=async_engine.submit,
            call_on_engine=async_engine.call,
        )
        print(f"junction serve: streaming cache events to {publisher.url}", file=sys.stderr)
    app = create_app(
        async_engine,
        model.name,
        publisher,
        tokenizer,
        card,
        feed=feed,
        feed_token=args.token,
        max_body_bytes=args.max_body_bytes,
        feed_send_timeout_s=args.feed_send_timeout,
        diagnosis=diagnosis,
    )
    run_until_stopped(app, args, bounds, publisher)
    return 0


def run_until_stopped(app, args: argparse.Namespace, bounds, publisher) -> None:
    """Serve `app` until SIGTERM or Ctrl-C, then flush the publisher's last events."""
    import uvicorn

    from protocol.connections.guarded import guarded_protocol

    signal.signal(signal.SIGTERM, exit_on_sigterm)  # so the `finally` below runs
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            http=guarded_protocol(bounds),  # idle sockets give way to requests
            backlog=bounds.within_open_files().backlog,
        )
    finally:
        if publisher is not None:
            # after the engine loop stopped: a last flush of its events
            finish_publishing(publisher, "serve", timeout_s=5.0, quiet=True)
