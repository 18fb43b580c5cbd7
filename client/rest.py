"""The control plane's REST API as its clients use it (the pins CLI, the dashboard): its reads
and writes under `/api/v1`, over the JSON transport `client.transport` gives every REST client.

Every failure is an `ApiError` (`ApiUnreachable` when nothing answered) whose `reason` is the
API's own account of the problem (`error_detail`: FastAPI's `detail`, a message or pydantic's
validation errors). Where the API is and the token to send are the caller's; `client.settings`
reads them from the environment.
"""

from __future__ import annotations

from typing import Any

import httpx

from client.transport import ApiError, ApiUnreachable, JsonClient, body_text

#: `ApiError` and `ApiUnreachable` are the transport's: every call of the client raises them.
__all__ = ["API_PREFIX", "ApiClient", "ApiError", "ApiUnreachable", "error_detail"]

API_PREFIX = "/api/v1"


class ApiClient(JsonClient):
    """One control plane at `base_url`; every call sends `token` as a bearer token (reads take
    the write token or the read-only one, writes only the write token: a client that reads
    with one and writes with the other is two clients)."""

    service = "the control plane"
    prefix = API_PREFIX

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

    def benchmark_suite(self) -> list[dict]:
        """The standard suite's specs (defaults filled in): the presets of a run's form."""
        return self.call("GET", "/benchmarks/suite")

    def whatif_runs(self, engine_id: str, limit: int = 50, status: str | None = None) -> dict:
        """An engine's what-if runs, newest first: `{"total", "offset", "limit", "runs"}`."""
        params = {"limit": limit, "status": status}
        return self.call("GET", f"/engines/{engine_id}/whatif", params=params)

    def whatif(self, run_id: int) -> dict:
        """One what-if run: status, progress and, once done, its report (`result`)."""
        return self.call("GET", f"/whatif/{run_id}")

    # ------------------------------------------------------------------ writes (token)
    def create_pin(self, body: dict) -> dict:
        return self.call("POST", "/pins", json=body)

    def release_pin(self, pin_id: str) -> dict:
        return self.call("DELETE", f"/pins/{pin_id}")

    def create_benchmark(self, spec: dict) -> dict:
        return self.call("POST", "/benchmarks", json=spec)

    def create_whatif(self, engine_id: str, settings: list[dict], epoch: int | None = None) -> dict:
        """Queue a replay of the engine's recorded requests under each of `settings` (the
        fields each changes from what ran); the queued run."""
        body: dict = {"settings": settings}
        if epoch is not None:
            body["epoch"] = epoch
        return self.call("POST", f"/engines/{engine_id}/whatif", json=body)

    def error_reason(self, response: httpx.Response) -> str:
        return error_detail(response)


def error_detail(response: httpx.Response) -> str:
    """What a failed answer says was wrong: FastAPI's `detail` as it is when a message, each
    validation error as `where: what` when pydantic's list (`where` the field's dotted path,
    without the leading `body`), else the body's text (or the status's reason phrase)."""
    try:
        detail = response.json()["detail"]
    except (ValueError, KeyError, TypeError):
        return body_text(response)
    if isinstance(detail, list):
        return "; ".join(_validation_error(item) for item in detail)
    return str(detail)


def _validation_error(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    where = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
    return f"{where}: {item.get('msg')}" if where else str(item.get("msg"))
