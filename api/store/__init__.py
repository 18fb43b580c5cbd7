"""The store: the tables (`models`, owned by Alembic through `migrate`), the database engine
and sessions (`db`), the many-rows writes that keep ingest fast (`bulk`), the reads the routes
page through (`engines`, `blocks`, `block_grid`, `requests`, `batches`, `paging`), and what
keeps it bounded for months (`retention`). Plain functions over a SQLAlchemy `Session`; nothing
here knows HTTP."""
