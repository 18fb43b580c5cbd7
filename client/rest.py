"""The control plane's REST API as its clients use it (the pins CLI, the dashboard): JSON over
httpx, every failure an `ApiError` that says what went wrong.

`ApiUnreachable` when nothing answered at the base URL (refused, timed out, a broken
connection); an `ApiError` with the HTTP status and the API's own account of the problem for
any answer but a 2xx (`error_detail`: FastAPI's `detail`, a message or pydantic's validation
errors). Where the API is and the token to send are the caller's; `client.settings` reads
them from the environment.
"""

from __future__ import annotations

from typing import Any

import httpx

API_PREFIX = "/api/v1"


class ApiError(Exception):
    """A request that failed: `method` and `path` (under `API_PREFIX`), the full `url` tried,
    the HTTP `status` (None: no answer) and `reason`, what was wrong."""

    def __init__(
        self, message: str, *, method: str, path: str, url: str, status: int | None, reason: str
    ) -> None:
        super().__init__(message)
        self.method = method
        self.path = path
        self.url = url
        self.status = status
        self.reason = reason


class ApiUnreachable(ApiError):
    """Nothing answered (`status` is None)."""


class ApiClient:
    """One control plane at `base_url`; every call sends `token` as a bearer token (reads take
    the write token or the read-only one, writes only the write token: a client that reads
    with one and writes with the other is two clients)."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    # ------------------------------------------------------------------ reads
    def engines(self) -> list[dict]:
        return self.call("GET", "/engines")

    def engine(self, engine_id: str) -> dict:
        return self.call("GET", f"/engines/{engine_id}")

    def hit_rate(self, engine_id: str, since: float | None = None) -> dict:
        return self.call("GET", f"/engines/{engine_id}/hit-rate", params={"since": since})

    def attribution(self, engine_id: str, since: float | None = None) -> dict:
        return self.call("GET", f"/engines/{engine_id}/attribution", params={"since": since})

    def requests(self, engine_id: str, limit: int = 100) -> dict:
        return self.call("GET", f"/engines/{engine_id}/requests", params={"limit": limit})

    def request(self, engine_id: str, request_id: str) -> dict:
        return self.call("GET", f"/engines/{engine_id}/requests/{request_id}")

    def block_grid(
        self,
        engine_id: str,
        group: str,
        start: int = 0,
        stop: int | None = None,
        keys: bool = False,
        max_cells: int | None = None,
    ) -> dict:
        params = {"group": group, "start": start, "stop": stop, "keys": keys}
        params["max_cells"] = max_cells
        return self.call("GET", f"/engines/{engine_id}/blocks/grid", params=params)

    def peer_blocks(
        self,
        engine_id: str,
        rank: int | None = None,
        group: str | None = None,
        medium: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> dict:
        """One page of an engine's hash-keyed blocks: `{"total", "blocks": [...]}`."""
        params = {"rank": rank, "group": group, "medium": medium}
        params |= {"limit": limit, "offset": offset}
        return self.call("GET", f"/engines/{engine_id}/peer-blocks", params=params)

    def peer_summary(self, engine_id: str, window_s: float | None = None) -> dict:
        """An engine's hash-keyed cache by group and medium, and its last `window_s` seconds
        of churn, metric samples, hit rate and resyncs."""
        params = {"window_s": window_s}
        return self.call("GET", f"/engines/{engine_id}/peer-summary", params=params)

    # the prefix views of a hash-keyed cache (`api.routes.peers.views`)
    def peer_tree(
        self,
        engine_id: str,
        rank: int | None = None,
        group: str = "attention",
        max_nodes: int = 200,
    ) -> dict:
        """`group`'s cached prefixes as a radix tree (Mamba states marked on the attention's)."""
        params = {"rank": rank, "group": group, "max_nodes": max_nodes}
        return self.call("GET", f"/engines/{engine_id}/peer-tree", params=params)

    def peer_suggested_junctions(
        self, engine_id: str, rank: int | None = None, limit: int = 20
    ) -> dict:
        """The branch points worth a Mamba state, with what would keep one (not the
        request-based `suggested_junctions` of Junction's own engines)."""
        params = {"rank": rank, "limit": limit}
        return self.call("GET", f"/engines/{engine_id}/suggested-junctions", params=params)

    def pins(self, state: str | None = None, engine_id: str | None = None) -> list[dict]:
        return self.call("GET", "/pins", params={"state": state, "engine_id": engine_id})

    def suggested_junctions(self, limit: int = 20) -> dict:
        return self.call("GET", "/junctions/suggested", params={"limit": limit})

    def benchmarks(self, limit: int = 50) -> dict:
        return self.call("GET", "/benchmarks", params={"limit": limit})

    def benchmark(self, run_id: int) -> dict:
        return self.call("GET", f"/benchmarks/{run_id}")

    # ------------------------------------------------------------------ writes (token)
    def create_pin(self, body: dict) -> dict:
        return self.call("POST", "/pins", json=body)

    def release_pin(self, pin_id: str) -> dict:
        return self.call("DELETE", f"/pins/{pin_id}")

    def create_benchmark(self, spec: dict) -> dict:
        return self.call("POST", "/benchmarks", json=spec)

    # ------------------------------------------------------------------
    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of `method path` under `API_PREFIX` (None for an empty one); query
        `params` that are None are left out. Raises `ApiError` saying why not."""
        url = f"{self.base_url}{API_PREFIX}{path}"
        if "params" in kwargs:
            kwargs["params"] = {k: v for k, v in kwargs["params"].items() if v is not None}
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        where = {"method": method, "path": path, "url": url}
        try:
            response = httpx.request(method, url, headers=headers, timeout=self.timeout_s, **kwargs)
        except httpx.HTTPError as exc:
            if isinstance(exc, httpx.TimeoutException):
                reason = f"no answer in {self.timeout_s:g} s"
            else:
                reason = str(exc) or type(exc).__name__
            message = f"cannot reach the control plane at {self.base_url}: {reason}"
            raise ApiUnreachable(message, **where, status=None, reason=reason) from exc
        if not response.is_success:
            reason = error_detail(response)
            message = f"{method} {path}: HTTP {response.status_code}: {reason}"
            raise ApiError(message, **where, status=response.status_code, reason=reason)
        return response.json() if response.content else None


def error_detail(response: httpx.Response) -> str:
    """What a failed answer says was wrong: FastAPI's `detail` as it is when a message, each
    validation error as `where: what` when pydantic's list (`where` the field's dotted path,
    without the leading `body`), else the body's text (or the status's reason phrase)."""
    try:
        detail = response.json()["detail"]
    except (ValueError, KeyError, TypeError):
        return response.text.strip()[:300] or response.reason_phrase
    if isinstance(detail, list):
        return "; ".join(_validation_error(item) for item in detail)
    return str(detail)


def _validation_error(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    where = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
    return f"{where}: {item.get('msg')}" if where else str(item.get("msg"))
