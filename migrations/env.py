"""Alembic's entry: the URL comes from the settings (`JUNCTION_DATABASE_URL`).

A caller may hand over its own URL in `config.attributes["database_url"]` (the `junction api`
command and the tests do, to migrate the database they were given)."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context

from api.settings import get_settings
from api.store.db import make_engine
from api.store.models import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def database_url() -> str:
    return config.attributes.get("database_url") or get_settings().database_url


def run_migrations_offline() -> None:
    url = database_url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = database_url()
    engine = make_engine(url, timeouts=None)  # a migration may run long on a healthy server
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=url.startswith("sqlite"),  # SQLite alters tables by copying
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
