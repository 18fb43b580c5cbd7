"""`junction route`: the router in front of a fleet of engines.

`cli/main.py` registers it with `add_route_parser(commands)`; web libraries load only when it
runs. Engines come from `--engine URL` (repeatable) or from the control plane's connected
engines (`--control-plane`, polled); the router reads their cache feeds with
`JUNCTION_API_TOKEN`, the token the engines were started with.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from urllib.parse import urlsplit

from client.settings import ControlPlaneSettings
from engine.setup.options import EXIT_BAD_INPUT
from protocol.body_size import add_max_body_option
from protocol.connections.options import add_connection_options, bounds_from_args
from router.affinity import DEFAULT_SPILL_S, KeyAffinity
from router.caches.index import DEFAULT_MAX_KEYS
from router.engines import DEFAULT_READ_TIMEOUT_S, FINISH_WAIT_S
from router.fleet import DEFAULT_RUNNING_COST, Fleet
from router.policies import (
    DEFAULT_MIN_HIT_SHARE,
    DEFAULT_POLICY,
    POLICIES,
    Policy,
    make_policy,
)
from router.readiness import Readiness

DEFAULT_START_TIMEOUT_S = 15.0


def add_route_parser(commands: argparse._SubParsersAction) -> None:
    settings = ControlPlaneSettings()
    route = commands.add_parser(
        "route",
        help="one OpenAI endpoint over several engines, routed by usable hybrid hit",
        description="Route each request to the engine whose cache serves most of it: the "
        "longest prefix cached in attention and backed by a recurrent state there, less "
        "its load.",
    )
    route.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="URL",
        help="an engine's base URL (http://host:port); repeat for each engine",
    )
    route.add_argument(
        "--control-plane",
        default=None,
        metavar="URL",
        help="find the engines among the control plane's connected engines instead (polled "
        f"every 5 s; default none; JUNCTION_CONTROL_PLANE_URL is {settings.control_plane_url!r})",
    )
    route.add_argument("--host", default="127.0.0.1")
    route.add_argument("--port", type=int, default=8100)
    route.add_argument(
        "--token",
        default=settings.api_token,
        help="the engines' token, for their cache feeds (env JUNCTION_API_TOKEN)",
    )
    route.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        choices=tuple(POLICIES),
        help=f"how to choose an engine (default {DEFAULT_POLICY}; the others are for comparison)",
    )
    route.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="the engines' Hugging Face model directory, for its tokenizer and chat template "
        "(default: the built-in model's byte tokenizer)",
    )
    route.add_argument(
        "--running-cost",
        type=int,
        default=DEFAULT_RUNNING_COST,
        metavar="TOKENS",
        help="prefill tokens one running request weighs in an engine's load "
        f"(default {DEFAULT_RUNNING_COST})",
    )
    route.add_argument(
        "--min-hit-share",
        type=float,
        default=DEFAULT_MIN_HIT_SHARE,
        metavar="SHARE",
        help="a hit below this share of the prompt counts as none, so a shared chat-template "
        f"header does not pull every request to one engine (default {DEFAULT_MIN_HIT_SHARE})",
    )
    add_cache_key_option(route)
    add_feed_lag_options(route)
    route.add_argument(
        "--max-index-keys",
        type=int,
        default=DEFAULT_MAX_KEYS,
        metavar="NUM",
        help="the most keys the router indexes for one engine (default "
        f"{DEFAULT_MAX_KEYS:,}, about 200 MB); an engine that announces more is left out",
    )
    add_timeout_options(route)
    add_connection_options(route)
    add_max_body_option(route)
    route.add_argument("--seed", type=int, default=None, help="the random policy's seed")
    route.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )
    route.set_defaults(func=cmd_route)


def add_cache_key_option(route: argparse.ArgumentParser) -> None:
    route.add_argument(
        "--cache-key-spill-s",
        type=float,
        default=DEFAULT_SPILL_S,
        metavar="SECONDS",
        help="a prompt_cache_key's requests stay on its engine until their predicted prefill "
        f"there is this much slower than on the best engine (default {DEFAULT_SPILL_S})",
    )


def add_feed_lag_options(route: argparse.ArgumentParser) -> None:
    """What the router does while an engine's feed has not yet said what a finished request
    stored (issue 50): wait for it, and score the prefix as expected there meanwhile."""
    route.add_argument(
        "--finish-wait-s",
        type=float,
        default=FINISH_WAIT_S,
        metavar="SECONDS",
        help="how long an answer's end waits for the engine's feed to report the request "
        "finished before it reaches the client (0: not at all; the prefix is expected on that "
        f"engine until the feed says it either way; default {FINISH_WAIT_S:g})",
    )
    route.add_argument(
        "--no-expectations",
        dest="expectations",
        action="store_false",
        help="for comparison: keep nothing of a finished request until the engine's feed "
        "reports it, scoring engines by their feeds' indexes alone (a feed that lags past "
        "--finish-wait-s then sends a family's next request elsewhere)",
    )


def check_finish_wait(seconds: float) -> float:
    """`--finish-wait-s` checked: finite and >= 0; `ValueError` naming the option."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"--finish-wait-s must be a number of seconds >= 0, got {seconds:g}")
    return seconds


def add_timeout_options(route: argparse.ArgumentParser) -> None:
    """How long the router waits for engines: at start, and for an answer."""
    route.add_argument(
        "--start-timeout",
        type=float,
        default=DEFAULT_START_TIMEOUT_S,
        metavar="SECONDS",
        help="how long to wait at start for an --engine to answer before giving up "
        f"(default {DEFAULT_START_TIMEOUT_S:g})",
    )
    route.add_argument(
        "--read-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        metavar="SECONDS",
        help="the longest an engine may send nothing while answering (a non-streamed answer "
        "comes whole at its end); then the client is answered 502 and the request is not "
        f"sent again (default {DEFAULT_READ_TIMEOUT_S:g})",
    )


def check_urls(urls: list[str]) -> list[str]:
    """The engine URLs without trailing slashes; `ValueError` naming a bad one."""
    checked = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--engine {url!r} is not an http(s)://host:port URL")
        checked.append(url.rstrip("/"))
    if len(set(checked)) != len(checked):
        raise ValueError("an --engine URL is given twice")
    return checked


def cmd_route(args: argparse.Namespace) -> int:
    settings = ControlPlaneSettings()
    try:
        urls = check_urls(args.engine)
        if not urls and not args.control_plane:
            raise ValueError(
                "no engines: give --engine URL for each engine, or --control-plane URL to "
                "route to the engines connected to it"
            )
        if not args.token:
            raise ValueError(
                "the engines' cache feeds need their token: set JUNCTION_API_TOKEN or --token"
            )
        if args.max_index_keys < 1:
            raise ValueError(f"--max-index-keys must be positive, got {args.max_index_keys}")
        if args.running_cost < 0:
            raise ValueError(f"--running-cost must be >= 0, got {args.running_cost}")
        if not args.read_timeout > 0:
            raise ValueError(f"--read-timeout must be positive, got {args.read_timeout:g}")
        if not args.start_timeout > 0:
            raise ValueError(f"--start-timeout must be positive, got {args.start_timeout:g}")
        check_finish_wait(args.finish_wait_s)
        policy = make_policy(args.policy, args.seed, args.min_hit_share)
        args.affinity = KeyAffinity(spill_s=args.cache_key_spill_s)
        args.bounds = bounds_from_args(args)
        from engine.model.hf.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(args.model)
    except (ValueError, OSError) as exc:
        print(f"junction route: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return asyncio.run(_serve(args, urls, tokenizer, policy, settings))


def fleet_from_args(args: argparse.Namespace, policy: Policy) -> Fleet:
    """The fleet the command's options ask for, no engines yet (`cmd_route` checked them and
    set `args.affinity`)."""
    return Fleet(
        [],
        policy,
        running_cost=args.running_cost,
        affinity=args.affinity,
        expectations=args.expectations,
    )


def _say_serving(args: argparse.Namespace, fleet: Fleet) -> None:
    """The line that says it serves, and how: a router without expectations is a comparison."""
    without = "" if args.expectations else " without expectations"
    print(
        f"junction route: {args.policy}{without} over {len(fleet.engines)} engines "
        f"({len(fleet.up())} up) at http://{args.host}:{args.port}/v1",
        file=sys.stderr,
        flush=True,
    )


async def _serve(args, urls, tokenizer, policy, settings: ControlPlaneSettings) -> int:
    import uvicorn

    from protocol.connections.guarded import guarded_protocol
    from router.app import create_app
    from router.discovery import discover, keep_discovering
    from router.engines import FleetEngine, follow

    if args.control_plane and not urls:
        try:
            urls = await discover(args.control_plane, args.token)
        except Exception as exc:  # noqa: BLE001 - said to the user, exit 2
            print(f"junction route: cannot list the engines: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    fleet = fleet_from_args(args, policy)
    readiness = Readiness(fleet)  # from now: a restarted router rebuilds from the snapshots
    followers: set[asyncio.Task] = set()

    def add(url: str) -> None:
        if url not in fleet.engines:
            engine = fleet.add(FleetEngine(url, max_index_keys=args.max_index_keys))
            followers.add(asyncio.create_task(follow(engine, args.token)))

    for url in urls:
        add(url)
    deadline = asyncio.get_running_loop().time() + args.start_timeout
    while not fleet.up() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
    if not fleet.up():
        reasons = "; ".join(
            f"{e.url}: {e.down_reason or 'no answer yet'}" for e in fleet.engines.values()
        )
        if not args.control_plane:
            print(
                f"junction route: none of the engines answered within {args.start_timeout:g} s "
                f"({reasons or 'none listed'}): start them, check the URLs and the token",
                file=sys.stderr,
            )
            for task in followers:
                task.cancel()
            return EXIT_BAD_INPUT
        print(f"junction route: no engine is up yet ({reasons or 'none listed'})", file=sys.stderr)

    def background() -> list:
        if args.control_plane:
            return [keep_discovering(args.control_plane, args.token, add)]
        return []

    tokens = tuple(t for t in (args.token, settings.read_token) if t)
    app = create_app(
        fleet,
        tokenizer,
        tokens,
        background,
        read_timeout_s=args.read_timeout,
        max_body_bytes=args.max_body_bytes,
        readiness=readiness,
        finish_wait_s=args.finish_wait_s,
    )
    _say_serving(args, fleet)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        http=guarded_protocol(args.bounds),  # idle sockets give way to requests
        backlog=args.bounds.within_open_files().backlog,
    )
    server = uvicorn.Server(config)
    try:
        await server.serve()
    finally:
        for task in followers:
            task.cancel()
    return 0
