"""`junction api`: migrate the database to the latest schema, then serve the control plane."""

from __future__ import annotations

import argparse
import logging


def add_api_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "api",
        help="run the control plane (REST API and ingest socket)",
        description="Run `alembic upgrade head` on JUNCTION_DATABASE_URL, then serve the API.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.set_defaults(func=run_api)
    migrate_parser = commands.add_parser(
        "migrate",
        help="migrate the store to the latest schema and exit",
        description="Run `alembic upgrade head` on JUNCTION_DATABASE_URL (what `junction api` "
        "does first; compose runs it once before the API and the workers start).",
    )
    migrate_parser.set_defaults(func=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    from api import migrate
    from api.settings import get_settings

    url = get_settings().database_url
    print(f"junction migrate: upgrading {url} to the latest schema", flush=True)
    migrate.upgrade(url)
    print("junction migrate: done", flush=True)
    return 0


def run_api(args: argparse.Namespace) -> int:
    import uvicorn

    from api import migrate
    from api.main import create_app
    from api.settings import get_settings

    settings = get_settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    migrate.upgrade(settings.database_url)
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=settings.log_level.lower(),
        # frames up to the limit reach `engine.wire.decode`, which answers larger ones with 1009
        ws_max_size=settings.max_frame_bytes + 1024 * 1024,
    )
    return 0
