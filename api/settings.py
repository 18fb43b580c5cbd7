"""The control plane's settings, from `JUNCTION_*` environment variables and a `.env` file.

Its clients' settings (where the control plane is, the token they send) are
`engine.control_plane`'s."""

from __future__ import annotations

from functools import lru_cache

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.control_plane import DEV_TOKEN
from engine.wire import MAX_FRAME_BYTES


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JUNCTION_", env_file=".env", extra="ignore")

    database_url: str = "sqlite:///./junction.db"
    api_token: str = DEV_TOKEN
    max_frame_bytes: int = MAX_FRAME_BYTES
    hit_rate_bucket_s: int = 60
    log_level: str = "info"
    # Celery (jobs/): the embedded default is Celery's SQLAlchemy transport on SQLite files;
    # compose and CI use Redis (`redis://127.0.0.1:6379/0`).
    broker_url: str = "sqla+sqlite:///./junction-broker.db"
    result_backend: str = "db+sqlite:///./junction-results.db"
    # The beat schedule of the standard benchmark suite, as a crontab (minute hour day month
    # weekday); nightly by default.
    benchmark_schedule: str = "0 3 * * *"
    # The dashboard's live refresh period, in seconds.
    dashboard_refresh_s: float = 3.0

    @field_validator("database_url")
    @classmethod
    def _psycopg_driver(cls, url: str) -> str:
        """A bare `postgresql://` (or `postgres://`) URL means psycopg 3, the driver installed."""
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        return url

    @field_validator("max_frame_bytes", "hit_rate_bucket_s")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError(f"must be positive, got {value}")
        return value


@lru_cache
def get_settings() -> Settings:
    return Settings()
