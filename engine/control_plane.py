"""Where a client finds the control plane: its URL and bearer token, read in one place.

Every client of the control plane reads these settings here: the engine (`--control-plane` and
`--token` of `replay` and `serve`, where it streams its cache events), the pins CLI, and the
dashboard. They come from `JUNCTION_CONTROL_PLANE_URL` and `JUNCTION_API_TOKEN`, in the
environment or a `.env` file, read when `ControlPlaneSettings()` is built (a command builds
it once; the dashboard once a run), not at import. The control plane's own settings, the
token it checks included, are `api.settings`.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

#: Where a REST client looks when no URL is set (`junction api`'s default address).
DEFAULT_URL = "http://127.0.0.1:8080"
#: The token a control plane started without `JUNCTION_API_TOKEN` checks (`junction up` and
#: `make run` use it); change it anywhere but on a laptop.
DEV_TOKEN = "junction-dev-token"


class ControlPlaneSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JUNCTION_", env_file=".env", extra="ignore")

    # None: not set. The engine then streams nowhere; REST clients use `url` (DEFAULT_URL).
    control_plane_url: str | None = None
    # None: not set. The engine refuses to stream without one; the pins CLI sends none.
    api_token: str | None = None

    @property
    def url(self) -> str:
        """The REST API's base URL, without a trailing slash."""
        return (self.control_plane_url or DEFAULT_URL).rstrip("/")
