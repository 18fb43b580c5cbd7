"""The control plane's REST API as the dashboard uses it: plain JSON over httpx.

Every failure becomes an `ApiError` whose message names the URL it tried, so a page can say
what went wrong instead of showing a traceback: `ApiUnreachable` when nothing answered there,
`ApiError` with the API's own `detail` for a 4xx or 5xx.
"""

from __future__ import annotations

from typing import Any

import httpx

API_PREFIX = "/api/v1"


class ApiError(Exception):
    """A request that failed; `url` is the one tried, `status` the HTTP status (None: no
    answer)."""

    def __init__(self, message: str, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class ApiUnreachable(ApiError):
    pass


class ApiClient:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    # ------------------------------------------------------------------ reads
    def engines(self) -> list[dict]:
        return self._call("GET", "/engines")

    def engine(self, engine_id: str) -> dict:
        return self._call("GET", f"/engines/{engine_id}")

    def hit_rate(self, engine_id: str, since: float | None = None) -> dict:
        return self._call("GET", f"/engines/{engine_id}/hit-rate", params={"since": since})

    def requests(self, engine_id: str, limit: int = 100) -> dict:
        return self._call("GET", f"/engines/{engine_id}/requests", params={"limit": limit})

    def request(self, engine_id: str, request_id: str) -> dict:
        return self._call("GET", f"/engines/{engine_id}/requests/{request_id}")

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
        return self._call("GET", f"/engines/{engine_id}/blocks/grid", params=params)

    def pins(self) -> list[dict]:
        return self._call("GET", "/pins")

    def suggested_junctions(self, limit: int = 20) -> dict:
        return self._call("GET", "/junctions/suggested", params={"limit": limit})

    def benchmarks(self, limit: int = 50) -> dict:
        return self._call("GET", "/benchmarks", params={"limit": limit})

    def benchmark(self, run_id: int) -> dict:
        return self._call("GET", f"/benchmarks/{run_id}")

    # ------------------------------------------------------------------ writes (token)
    def create_pin(self, body: dict) -> dict:
        return self._call("POST", "/pins", json=body)

    def release_pin(self, pin_id: str) -> dict:
        return self._call("DELETE", f"/pins/{pin_id}")

    def create_benchmark(self, spec: dict) -> dict:
        return self._call("POST", "/benchmarks", json=spec)

    # ------------------------------------------------------------------
    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        url = f"{self.base_url}{API_PREFIX}{path}"
        if "params" in kwargs:
            kwargs["params"] = {k: v for k, v in kwargs["params"].items() if v is not None}
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            response = httpx.request(method, url, headers=headers, timeout=self.timeout_s, **kwargs)
        except httpx.TimeoutException as exc:
            raise ApiUnreachable(f"the control plane at {url} did not answer in time", url) from exc
        except httpx.HTTPError as exc:
            raise ApiUnreachable(f"could not reach the control plane at {url}: {exc}", url) from exc
        if response.status_code >= 400:
            raise ApiError(
                f"{method} {url} failed ({response.status_code}): {_detail(response)}",
                url,
                response.status_code,
            )
        return response.json() if response.content else None


def _detail(response: httpx.Response) -> str:
    """FastAPI's `detail` (a string, or the validation errors' messages), else the body."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        return response.text[:300]
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(p) for p in item.get('loc', []))}: {item.get('msg')}"
            for item in detail
            if isinstance(item, dict)
        )
    return str(detail)
