"""The control plane's settings, from `JUNCTION_*` environment variables and a `.env` file.

Its clients' settings (where the control plane is, the token they send, the dashboard's
refresh period) are `client.settings`'s."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.wire import MAX_FRAME_BYTES


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JUNCTION_", env_file=".env", extra="ignore")

    database_url: str = "sqlite:///./junction.db"
    # PostgreSQL only (`api.store.db`): how long connecting may take, and how long a statement
    # (a commit, a ping) may wait for the server's answer before the connection is given up
    # and the request answered 503; a partition that holds connections open must not hang
    # the API. Raise the second for statements that legitimately run longer.
    db_connect_timeout_s: float = 5.0
    db_statement_timeout_s: float = 30.0
    # The write token (writes, ingest, and reads). None: `junction api` makes one at first start
    # and keeps it in `api_token_file` (`api.guards.token`); there is no built-in token.
    api_token: str | None = None
    # None: `junction-api-token` beside the SQLite store, else in the working directory.
    api_token_file: Path | None = None
    # An optional read-only token: it reads, it cannot write. None (or empty): there is none.
    read_token: str | None = None
    # The browser origins the ingest socket accepts (comma-separated); engines send no Origin.
    # Empty: a connection that sends one is refused.
    allowed_origins: Annotated[list[str], NoDecode] = []
    max_frame_bytes: int = MAX_FRAME_BYTES
    # the most frame bytes one snapshot's chunks may take (a table bigger than a frame)
    max_snapshot_bytes: int = 1024 * 1024 * 1024
    # what every connection's unfinished snapshots hold at once, and how long one may wait for
    # its next chunk (past either: closed 1013, the engine sends its table again later)
    max_snapshot_bytes_total: int = 1024 * 1024 * 1024
    snapshot_idle_s: float = 60.0
    # An engine id's lease (`api.ingest.lease`): another engine process's hello is refused
    # while the holder is connected, and for `engine_lease_s` after it was last seen; a hello
    # whose epoch (the engine's start time) is more than `max_epoch_ahead_s` ahead is refused.
    engine_lease_s: float = 15.0
    max_epoch_ahead_s: float = 300.0
    hit_rate_bucket_s: int = 60
    # case-insensitive; uvicorn's and logging's names
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    # Celery (jobs/): the embedded default is Celery's SQLAlchemy transport on SQLite files;
    # compose and CI use Redis (`redis://127.0.0.1:6379/0`).
    broker_url: str = "sqla+sqlite:///./junction-broker.db"
    result_backend: str = "db+sqlite:///./junction-results.db"
    # The beat schedule of the standard benchmark suite, as a crontab (minute hour day month
    # weekday); nightly by default.
    benchmark_schedule: str = "0 3 * * *"

    @field_validator("database_url")
    @classmethod
    def _psycopg_driver(cls, url: str) -> str:
        """A bare `postgresql://` (or `postgres://`) URL means psycopg 3, the driver installed."""
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        return url

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("read_token", "api_token_file", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [origin.strip() for origin in value.split(",") if origin.strip()]
        return value

    # Limits of `junction api` (docs/api.md, "Limits"): a request body's size (the pin route's
    # own, for its token ids), the seconds a client may take to send its headers and between
    # two chunks of its body, the seconds an idle keep-alive connection stays open, the
    # connections at once (waiting, serving, websockets: a new one over it closes the oldest
    # waiting one, else is refused 503), those waiting for a request in all and per client IP
    # (one more closes the oldest waiting: `api.guards.idle_connections`), and a request's
    # head in bytes.
    max_body_bytes: int = 1024 * 1024
    max_pin_body_bytes: int = 16 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    keep_alive_timeout_s: int = 5
    max_connections: int = 1000
    max_idle_connections: int = 512
    max_idle_connections_per_ip: int = 64
    max_header_bytes: int = 16 * 1024
    # Reads of the REST API run at most `max_concurrent_reads` at once, the next ones wait (at
    # most `max_waiting_reads` of them, for `read_wait_s`), so the ingest socket keeps its
    # priority; event reads (`GET /api/v1/events`) in a lane of their own, at most
    # `max_concurrent_event_reads` at once, never behind other reads (`api.guards.read_limit`).
    max_concurrent_reads: int = 4
    max_concurrent_event_reads: int = 2
    max_waiting_reads: int = 256
    read_wait_s: float = 30.0

    # Dead letters (`api.ingest.dead_letters`): the frames the store refused, parked so the stream
    # goes on. Each engine keeps its newest `dead_letters_per_engine`, each frame's first
    # `dead_letter_frame_bytes` bytes of JSON.
    dead_letters_per_engine: int = 1000
    dead_letter_frame_bytes: int = 64 * 1024

    # Miss attribution (`api.attribution.record`): the secret that salts the match-unit hashes the
    # store keeps (never logged or served; None: 32 random bytes made once and kept in the
    # store), and the bounds of those hashes per engine: seconds since a unit was last seen,
    # and the most units kept (the least recently seen go first).
    attribution_salt: SecretStr | None = None
    attribution_window_s: float = 86400.0
    attribution_max_units: int = 1_000_000

    # What-if replays (`api.whatif`): the finished requests whose salted chains are kept per
    # engine for a replay (the oldest finished go first; none outlives the attribution window,
    # and no route serves them), and the what-if runs kept in all (past it, the oldest finished
    # go; a new run is refused while that many are queued or running). A run's estimated peak
    # bytes and seconds (`whatif.budget`) are bounded: past them it is refused (422) before it
    # is queued, and a worker stops a run that goes past its seconds (failed, saying why).
    whatif_max_requests: int = 100_000
    whatif_max_runs: int = 1000
    whatif_max_bytes: int = 2 << 30
    whatif_max_seconds: float = 1800.0

    # Engines without physical block ids (`api.peers.blocks`: vLLM, SGLang through `junction
    # attach`): the token ids kept of each block (its first ones), the most blocks kept per
    # engine (stores past it are refused and recorded as a resync), the seconds their churn
    # buckets, metric samples and resyncs are kept, and the most samples and resyncs kept per
    # engine (the oldest go first).
    peer_token_sample: int = 32
    peer_max_blocks: int = 1_000_000
    peer_window_s: float = 86400.0
    peer_max_samples: int = 100_000

    # Replicas (`api.fleet.replicas`): any number of `junction api` processes on one PostgreSQL.
    # Each writes a heartbeat every `replica_heartbeat_s`; one silent for `replica_timeout_s`
    # is dead, and the engines whose sockets it held show as disconnected. SQLite is one
    # process only: a second `junction api` on the same file is refused.
    replica_heartbeat_s: float = 1.0
    replica_timeout_s: float = 5.0

    # Retention (`api.retention`): a periodic task, every `retention_interval_s`, on one
    # replica at a time, deleting at most `retention_chunk_rows` rows per transaction.
    # Event batches are kept `retention_batches_s` seconds and at most
    # `retention_batches_per_engine` per engine (an older epoch's go once its table was
    # replaced); finished requests `retention_requests_s` seconds and at most
    # `retention_requests_per_engine` per engine; hit-rate buckets older than
    # `retention_rollup_after_s` are rolled up into buckets of `retention_rollup_bucket_s`,
    # and those older than `retention_buckets_s` are dropped.
    retention_interval_s: float = 60.0
    retention_chunk_rows: int = 5000
    retention_batches_s: float = 86400.0
    retention_batches_per_engine: int = 100_000
    retention_requests_s: float = 7 * 86400.0
    retention_requests_per_engine: int = 1_000_000
    retention_rollup_after_s: float = 86400.0
    retention_rollup_bucket_s: int = 3600
    retention_buckets_s: float = 90 * 86400.0

    @field_validator("attribution_salt", mode="before")
    @classmethod
    def _salt_or_none(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        if isinstance(value, str) and len(value) < 16:
            raise ValueError("JUNCTION_ATTRIBUTION_SALT must have at least 16 characters")
        return value

    @field_validator("attribution_window_s", "attribution_max_units")
    @classmethod
    def _positive_attribution(cls, value: float, info: ValidationInfo) -> float:
        if value <= 0:
            raise ValueError(f"JUNCTION_{info.field_name.upper()} must be positive, got {value}")
        return value

    @field_validator(
        "db_connect_timeout_s",
        "db_statement_timeout_s",
        "max_frame_bytes",
        "max_snapshot_bytes",
        "max_snapshot_bytes_total",
        "snapshot_idle_s",
        "engine_lease_s",
        "max_epoch_ahead_s",
        "hit_rate_bucket_s",
        "max_body_bytes",
        "max_pin_body_bytes",
        "header_timeout_s",
        "body_timeout_s",
        "keep_alive_timeout_s",
        "max_connections",
        "max_idle_connections",
        "max_idle_connections_per_ip",
        "max_header_bytes",
        "max_concurrent_reads",
        "max_concurrent_event_reads",
        "max_waiting_reads",
        "read_wait_s",
        "dead_letters_per_engine",
        "dead_letter_frame_bytes",
        "peer_max_blocks",
        "whatif_max_requests",
        "whatif_max_runs",
        "whatif_max_bytes",
        "whatif_max_seconds",
        "peer_window_s",
        "peer_max_samples",
        "replica_heartbeat_s",
        "replica_timeout_s",
        "retention_interval_s",
        "retention_chunk_rows",
        "retention_batches_s",
        "retention_batches_per_engine",
        "retention_requests_s",
        "retention_requests_per_engine",
        "retention_rollup_after_s",
        "retention_rollup_bucket_s",
        "retention_buckets_s",
    )
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(f"must be positive, got {value}")
        return value

    @field_validator("replica_timeout_s")
    @classmethod
    def _timeout_outlasts_heartbeats(cls, value: float, info: ValidationInfo) -> float:
        heartbeat = info.data.get("replica_heartbeat_s")
        if heartbeat is not None and value < 2 * heartbeat:
            raise ValueError(
                f"must be at least twice JUNCTION_REPLICA_HEARTBEAT_S ({heartbeat}), got {value}:"
                " a replica is dead after missing two heartbeats at least"
            )
        return value

    @field_validator("retention_rollup_bucket_s")
    @classmethod
    def _whole_buckets(cls, value: int, info: ValidationInfo) -> int:
        fine = info.data.get("hit_rate_bucket_s")
        if fine is not None and value % fine:
            raise ValueError(
                f"must be a multiple of JUNCTION_HIT_RATE_BUCKET_S ({fine}), got {value}"
            )
        return value

    @field_validator("retention_buckets_s")
    @classmethod
    def _buckets_outlast_rollup(cls, value: float, info: ValidationInfo) -> float:
        after = info.data.get("retention_rollup_after_s")
        if after is not None and value < after:
            raise ValueError(
                f"must be at least JUNCTION_RETENTION_ROLLUP_AFTER_S ({after}), got {value}"
            )
        return value

    @field_validator("peer_token_sample")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"must be 0 or more, got {value}")
        return value


@lru_cache
def get_settings() -> Settings:
    return Settings()
