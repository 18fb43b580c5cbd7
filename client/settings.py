"""Where a client finds the control plane: its URL and bearer tokens, read in one place.

Every client of the control plane reads these settings here: the engine (`--control-plane` and
`--token` of `replay` and `serve`, where it streams its cache events), the pins CLI, and the
dashboard. They come from `JUNCTION_CONTROL_PLANE_URL`, `JUNCTION_API_TOKEN` and
`JUNCTION_READ_TOKEN` (and `JUNCTION_ROUTER_URL`, where the dashboard finds `junction route`,
read with the same token), in the environment or a `.env` file, read when
`ControlPlaneSettings()` is built (a command builds it once; the dashboard once a run), not at
import. The dashboard's own settings (`JUNCTION_DASHBOARD_REFRESH_S`) are `DashboardSettings`.
There is no default token: the control plane's own settings, and the tokens it checks, are
`api.settings` and `api.guards.token`.
"""

from __future__ import annotations

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Where a REST client looks when no URL is set (`junction api`'s default address).
DEFAULT_URL = "http://127.0.0.1:8080"


class ControlPlaneSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JUNCTION_", env_file=".env", extra="ignore")

    # None: not set. The engine then streams nowhere; REST clients use `url` (DEFAULT_URL).
    control_plane_url: str | None = None
    # The write token. None: not set; the engine refuses to stream and the pins CLI to run.
    api_token: str | None = None
    # A read-only token (the dashboard reads with it first). None (or empty): not set.
    read_token: str | None = None
    # `junction route`'s base URL, whose `/fleet` the dashboard reads. None (or empty): not set.
    router_url: str | None = None

    @field_validator("api_token", "read_token", "router_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @property
    def reader_token(self) -> str | None:
        """The token a reader sends: the read-only one, else the write token (None: neither)."""
        return self.read_token or self.api_token

    @property
    def url(self) -> str:
        """The REST API's base URL, without a trailing slash."""
        return (self.control_plane_url or DEFAULT_URL).rstrip("/")


class DashboardSettings(BaseSettings):
    """The dashboard's own settings, apart from `ControlPlaneSettings`: every command reads
    those (some of its options default to them), and a bad dashboard setting must not stop
    `junction pin` or `junction serve`."""

    model_config = SettingsConfigDict(env_prefix="JUNCTION_", env_file=".env", extra="ignore")

    # The live refresh period of its pages, in seconds.
    dashboard_refresh_s: float = 3.0

    @field_validator("dashboard_refresh_s")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(f"must be positive, got {value}")
        return value
