"""The store: the tables (`models`, owned by Alembic through `migrate`), the database engine
and sessions (`db`), the many-rows writes that keep ingest fast (`bulk`), and the reads the
routes page through (`engines`, `blocks`, `block_grid`, `requests`, `batches`, `paging`).
Plain functions over a SQLAlchemy `Session`; nothing here knows HTTP, and nothing here imports
the rest of `api/` but its settings: every other part builds on it (what keeps it bounded,
which needs the hit-rate buckets, is `api.retention`)."""
