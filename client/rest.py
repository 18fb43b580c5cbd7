"""The control plane's REST API as its clients use it (the pins CLI, the dashboard): its reads
and writes under `/api/v1`, over the JSON transport `client.transport` gives every REST client.

Each read returns its answer as the struct `client.types` names for it (`engines()` a list of
`EngineOut`, `hit_rate()` a `HitRateOut`, ...), its fields as the API's model has them.
Every failure is an `ApiError` (`ApiUnreachable` when nothing answered) whose `reason` is the
API's own account of the problem (`error_detail`: FastAPI's `detail`, a message or pydantic's
validation errors). Where the API is and the token to send are the caller's; `client.settings`
reads them from the environment.
"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from client.schema import ATTENTION
from client.transport import ApiError, ApiUnreachable, JsonClient, body_text
from client.types import (
    AttributionOut,
    BenchmarkRunOut,
    BenchmarkRunPage,
    BlockGrid,
    EngineDetail,
    EngineOut,
    HitRateOut,
    JunctionPage,
    JunctionPinRequest,
    PeerBlockPage,
    PeerJunctionPage,
    PeerSummary,
    PeerTreeOut,
    PinOut,
    RequestOut,
    RequestPage,
    TierPage,
    WhatIfRunOut,
    WhatIfRunPage,
)

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
    def engines(self) -> list[EngineOut]:
        return self.call("GET", "/engines", into=list[EngineOut])

    def engine(self, engine_id: str) -> EngineDetail:
        return self.call("GET", f"/engines/{engine_id}", into=EngineDetail)

    def hit_rate(self, engine_id: str, since: float | None = None) -> HitRateOut:
        path = f"/engines/{engine_id}/hit-rate"
        return self.call("GET", path, params={"since": since}, into=HitRateOut)

    def attribution(self, engine_id: str, since: float | None = None) -> AttributionOut:
        path = f"/engines/{engine_id}/attribution"
        return self.call("GET", path, params={"since": since}, into=AttributionOut)

    def requests(self, engine_id: str, limit: int = 100) -> RequestPage:
        path = f"/engines/{engine_id}/requests"
        return self.call("GET", path, params={"limit": limit}, into=RequestPage)

    def request(self, engine_id: str, request_id: str) -> RequestOut:
        return self.call("GET", f"/engines/{engine_id}/requests/{request_id}", into=RequestOut)

    def block_grid(
        self,
        engine_id: str,
        group: str,
        start: int = 0,
        stop: int | None = None,
        keys: bool = False,
        max_cells: int | None = None,
    ) -> BlockGrid:
        params = {"group": group, "start": start, "stop": stop, "keys": keys}
        params["max_cells"] = max_cells
        return self.call("GET", f"/engines/{engine_id}/blocks/grid", params=params, into=BlockGrid)

    def tier_units(
        self, engine_id: str, tier: str | None = None, limit: int = 1000, offset: int = 0
    ) -> TierPage:
        """Where an engine's blocks live below its device: each tier's usage now and one page
        of the units held (`tier` filters it)."""
        params = {"tier": tier, "limit": limit, "offset": offset}
        return self.call("GET", f"/engines/{engine_id}/blocks/tiers", params=params, into=TierPage)

    def peer_blocks(
        self,
        engine_id: str,
        rank: int | None = None,
        group: str | None = None,
        medium: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> PeerBlockPage:
        """One page of an engine's hash-keyed blocks: `total` and the page's `blocks`."""
        params = {"rank": rank, "group": group, "medium": medium}
        params |= {"limit": limit, "offset": offset}
        path = f"/engines/{engine_id}/peer-blocks"
        return self.call("GET", path, params=params, into=PeerBlockPage)

    def peer_summary(self, engine_id: str, window_s: float | None = None) -> PeerSummary:
        """An engine's hash-keyed cache by group and medium, and its last `window_s` seconds
        of churn, metric samples, hit rate and resyncs."""
        params = {"window_s": window_s}
        path = f"/engines/{engine_id}/peer-summary"
        return self.call("GET", path, params=params, into=PeerSummary)

    # the prefix views of a hash-keyed cache (`api.routes.peers.views`)
    def peer_tree(
        self,
        engine_id: str,
        rank: int | None = None,
        group: str = ATTENTION,
        max_nodes: int = 200,
    ) -> PeerTreeOut:
        """`group`'s cached prefixes as a radix tree (Mamba states marked on the attention's)."""
        params = {"rank": rank, "group": group, "max_nodes": max_nodes}
        return self.call("GET", f"/engines/{engine_id}/peer-tree", params=params, into=PeerTreeOut)

    def peer_suggested_junctions(
        self, engine_id: str, rank: int | None = None, limit: int = 20
    ) -> PeerJunctionPage:
        """The branch points worth a Mamba state, with what would keep one (not the
        request-based `suggested_junctions` of Junction's own engines)."""
        params = {"rank": rank, "limit": limit}
        path = f"/engines/{engine_id}/suggested-junctions"
        return self.call("GET", path, params=params, into=PeerJunctionPage)

    def pins(self, state: str | None = None, engine_id: str | None = None) -> list[PinOut]:
        params = {"state": state, "engine_id": engine_id}
        return self.call("GET", "/pins", params=params, into=list[PinOut])

    def suggested_junctions(self, limit: int = 20) -> JunctionPage:
        return self.call("GET", "/junctions/suggested", params={"limit": limit}, into=JunctionPage)

    def benchmarks(self, limit: int = 50) -> BenchmarkRunPage:
        return self.call("GET", "/benchmarks", params={"limit": limit}, into=BenchmarkRunPage)

    def benchmark(self, run_id: int) -> BenchmarkRunOut:
        return self.call("GET", f"/benchmarks/{run_id}", into=BenchmarkRunOut)

    def benchmark_suite(self) -> list[dict[str, Any]]:
        """The standard suite's specs (defaults filled in): the presets of a run's form."""
        return self.call("GET", "/benchmarks/suite", into=list[dict[str, Any]])

    def whatif_runs(
        self, engine_id: str, limit: int = 50, status: str | None = None
    ) -> WhatIfRunPage:
        """An engine's what-if runs, newest first."""
        params = {"limit": limit, "status": status}
        return self.call("GET", f"/engines/{engine_id}/whatif", params=params, into=WhatIfRunPage)

    def whatif(self, run_id: int) -> WhatIfRunOut:
        """One what-if run: status, progress and, once done, its report (`result`)."""
        return self.call("GET", f"/whatif/{run_id}", into=WhatIfRunOut)

    # ------------------------------------------------------------------ writes (token)
    def create_pin(self, body: dict | JunctionPinRequest) -> PinOut:
        """Pin a prefix: `body` is `POST /pins`' (a suggested junction's `pin_request` is one)."""
        return self.call("POST", "/pins", json=msgspec.to_builtins(body), into=PinOut)

    def release_pin(self, pin_id: str) -> PinOut:
        return self.call("DELETE", f"/pins/{pin_id}", into=PinOut)

    def create_benchmark(self, spec: dict) -> BenchmarkRunOut:
        return self.call("POST", "/benchmarks", json=spec, into=BenchmarkRunOut)

    def create_whatif(
        self, engine_id: str, settings: list[dict], epoch: int | None = None
    ) -> WhatIfRunOut:
        """Queue a replay of the engine's recorded requests under each of `settings` (the
        fields each changes from what ran); the queued run."""
        body: dict = {"settings": settings}
        if epoch is not None:
            body["epoch"] = epoch
        return self.call("POST", f"/engines/{engine_id}/whatif", json=body, into=WhatIfRunOut)

    def error_reason(self, response: httpx.Response) -> str:
        return error_detail(response)


def error_detail(response: httpx.Response) -> str:
    """What a failed answer says was wrong: a 422's `message` (its problems, one line each,
    joined here with "; "), FastAPI's `detail` as it is when a message, each validation error
    as `where: what` when pydantic's list (an older control plane's 422: `where` the field's
    dotted path, without the leading `body`), else the body's text (or the status's reason
    phrase)."""
    try:
        body = response.json()
        message = body.get("message") if isinstance(body, dict) else None
        if isinstance(message, str) and message:  # a 422's problems, one line each
            return message.replace("\n", "; ")
        detail = body["detail"]
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
