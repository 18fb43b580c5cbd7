"""`junction api`: migrate the database to the latest schema, then serve the control plane."""

from __future__ import annotations

import argparse
import gc
import logging
import sys

EXIT_BAD_INPUT = 2


def add_api_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "api",
        help="run the control plane (REST API and ingest socket)",
        description="Run `alembic upgrade head` on JUNCTION_DATABASE_URL, then serve the API. "
        "Every route but /healthz and /metrics needs JUNCTION_API_TOKEN (reads: it or "
        "JUNCTION_READ_TOKEN); unset, a token is made at first start and kept in "
        "JUNCTION_API_TOKEN_FILE (default: junction-api-token beside the SQLite store).",
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


def shown_url(url: str) -> str:
    """The database URL with its password hidden."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def upgrade_or_say(command: str, url: str) -> bool:
    """Migrate the store at `url`; False, having said so in one line on stderr, when the
    database cannot be reached or opened (a server not listening, a refused login, a missing
    database or directory) instead of SQLAlchemy's traceback of a hundred lines."""
    from sqlalchemy.exc import OperationalError

    from api.store import migrate

    try:
        migrate.upgrade(url)
    except OperationalError as exc:
        lines = str(exc.orig or exc).splitlines()
        reason = "; ".join(line.strip() for line in lines if line.strip())  # the driver's words
        print(
            f"junction {command}: cannot open the database "
            f"JUNCTION_DATABASE_URL={shown_url(url)}: {reason} (check that it runs and that "
            "the URL is right, or set JUNCTION_DATABASE_URL to one that answers)",
            file=sys.stderr,
            flush=True,
        )
        return False
    return True


def run_migrate(args: argparse.Namespace) -> int:
    from api.settings import get_settings

    url = get_settings().database_url
    print(f"junction migrate: upgrading {shown_url(url)} to the latest schema", flush=True)
    if not upgrade_or_say("migrate", url):
        return EXIT_BAD_INPUT
    print("junction migrate: done", flush=True)
    return 0


def shared_token(database_url: str, api_token):
    """`api.guards.shared_token.share_token` on a short-lived engine of `database_url`."""
    from api.guards.shared_token import share_token
    from api.store.db import make_engine

    db = make_engine(database_url)
    try:
        return share_token(db, api_token)
    finally:
        db.dispose()


def run_api(args: argparse.Namespace) -> int:
    import uvicorn

    from api.fleet.replicas import SingleProcessStore, claim_sqlite
    from api.guards.idle_connections import bounds_of
    from api.guards.token import TokenError, resolve_token, where
    from api.main import create_app
    from api.settings import get_settings

    settings = get_settings()
    try:
        api_token = resolve_token(settings)
    except TokenError as exc:
        print(f"junction api: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:  # before migrating: a SQLite store serves one process (the app's start claims too)
        claim_sqlite(settings.database_url)
    except SingleProcessStore as exc:
        print(f"junction api: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.log_level != "debug":  # its INFO lines (plugins, DDL mode) ask nothing of anyone
        logging.getLogger("alembic").setLevel(logging.WARNING)
    if not upgrade_or_say("api", settings.database_url):
        return EXIT_BAD_INPUT
    if not settings.database_url.startswith("sqlite"):  # replicas share one token
        try:
            api_token = shared_token(settings.database_url, api_token)
        except TokenError as exc:
            print(f"junction api: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    print(f"junction api: {where(api_token)}", flush=True)
    settings = settings.model_copy(update={"api_token": api_token.token})
    app = create_app(settings)
    # what start-up made (modules, the app, SQLAlchemy's caches) lives as long as the process:
    # frozen, the collector's full passes skip it (ingest makes many short-lived containers,
    # and each full pass walked all of it: 20 ms per 1,000 events ingested, measured in
    # benchmarks/ingest.py's breakdown)
    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=settings.log_level.lower(),
        # frames up to the limit reach `engine.wire.decode`, which answers larger ones with 1009
        ws_max_size=settings.max_frame_bytes + 1024 * 1024,
        # limits (docs/api.md, "Limits"): h11 with a read timeout on each request's headers
        # (uvicorn has none) and its own bounds on connections, where idle ones give way to
        # requests (uvicorn's `limit_concurrency` counts idle sockets against requests: unset),
        # the head's size, idle keep-alive connections
        http="api.guards.idle_connections:GuardedProtocol",
        backlog=bounds_of(settings).backlog,  # an accept burst fits in the open files
        h11_max_incomplete_event_size=settings.max_header_bytes,
        timeout_keep_alive=settings.keep_alive_timeout_s,
    )
    return 0
