"""`junction serve`: the engine behind its OpenAI-compatible server.

`engine/cli.py` registers it with `add_serve_parser(commands)`. Web libraries are imported
only when the command runs, so the rest of the command line stays light.
"""

from __future__ import annotations

import argparse
import os
import sys

from engine.cli import (
    EXIT_BAD_INPUT,
    add_cache_options,
    add_model_options,
    configs_from_args,
    model_config_from_args,
)

DEFAULT_MODEL_NAME = "junction-hybrid-tiny"


def add_serve_parser(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="run the engine behind an OpenAI-compatible server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--model-name", default=DEFAULT_MODEL_NAME, help="the model name clients must send"
    )
    serve.add_argument("--engine-id", default="engine-0", help="this engine's id in events")
    serve.add_argument(
        "--control-plane",
        default=os.environ.get("JUNCTION_CONTROL_PLANE_URL"),
        help="control plane URL to stream cache events to (env JUNCTION_CONTROL_PLANE_URL)",
    )
    serve.add_argument(
        "--token",
        default=os.environ.get("JUNCTION_API_TOKEN"),
        help="bearer token for the control plane (env JUNCTION_API_TOKEN)",
    )
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
    if args.control_plane:
        print(
            f"junction serve: streaming events to the control plane ({args.control_plane}) "
            "is not built yet; serving without it",
            file=sys.stderr,
        )

    import uvicorn

    from engine.engine import Engine
    from engine.server.app import create_app
    from engine.server.async_engine import AsyncEngine

    try:
        engine = Engine(cache, scheduler, model, runner=args.runner, engine_id=args.engine_id)
    except (ValueError, OSError) as exc:
        print(f"junction serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    app = create_app(AsyncEngine(engine), args.model_name)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
