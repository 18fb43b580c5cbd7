"""`junction serve`: the engine behind its OpenAI-compatible server.

`cli/main.py` registers it with `add_serve_parser(commands)`. Web libraries are imported
only when the command runs, so the rest of the command line stays light.
"""

from __future__ import annotations

import argparse
import sys

from engine.options import (
    EXIT_BAD_INPUT,
    add_cache_options,
    add_model_options,
    configs_from_args,
    model_config_from_args,
)
from engine.server.streaming import (
    add_control_plane_options,
    connect,
    finish_publishing,
    make_publisher,
)

DEFAULT_MODEL_NAME = "junction-hybrid-tiny"


def add_serve_parser(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="run the engine behind an OpenAI-compatible server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--model-name", default=DEFAULT_MODEL_NAME, help="the model name clients must send"
    )
    add_control_plane_options(serve)
    serve.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )
    add_cache_options(serve)
    add_model_options(serve)
    # a server runs the model; 512 Mamba slots keep its state pool near 200 MB by default
    serve.set_defaults(func=cmd_serve, runner="torch", num_mamba_blocks=512)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        cache, scheduler = configs_from_args(args)
        model = model_config_from_args(args)
    except ValueError as exc:
        print(f"junction serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    publisher = None
    if args.control_plane:
        publisher = make_publisher(args, args.model_name)
        if publisher is None:
            return EXIT_BAD_INPUT

    import uvicorn

    from engine.engine import Engine
    from engine.server.app import create_app
    from engine.server.async_engine import AsyncEngine

    try:
        engine = Engine(cache, scheduler, model, runner=args.runner, engine_id=args.engine_id)
    except (ValueError, OSError) as exc:
        print(f"junction serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    async_engine = AsyncEngine(engine)
    if publisher is not None:
        # the listener runs on the engine loop's thread; `call` reaches it while it is idle
        connect(publisher, engine, wake=async_engine.submit, call_on_engine=async_engine.call)
        print(f"junction serve: streaming cache events to {publisher.url}", file=sys.stderr)
    app = create_app(async_engine, args.model_name, publisher)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        if publisher is not None:
            # after the engine loop stopped: a last flush of its events
            finish_publishing(publisher, "serve", timeout_s=5.0, quiet=True)
    return 0
