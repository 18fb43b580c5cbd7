"""One JSON-over-HTTP service at a base URL, as Junction's REST clients call it: a bearer token,
a timeout, and every failure an `ApiError` that says what went wrong.

`ApiUnreachable` when nothing answered at the base URL (refused, timed out, a broken
connection); an `ApiError` with the HTTP status and the service's own account of the problem
for any answer but a 2xx, or for a 2xx whose body does not fit the struct it should be
(`client.types`). `JsonClient` is the transport the control plane's client
(`client.rest`) and the router's (`client.router`) share: each names its service, the prefix
its paths sit under, and how its answers say what was wrong.
"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec


class ApiError(Exception):
    """A request that failed: `method` and `path` (under the client's `prefix`), the full
    `url` tried, the HTTP `status` (None: no answer) and `reason`, what was wrong."""

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


class JsonClient:
    """One service at `base_url`; every call sends `token` as a bearer token (None: none)."""

    #: The service as the unreachable error names it ("cannot reach the router at ...").
    service = "the service"
    #: What every path sits under (`/api/v1` for the control plane).
    prefix = ""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, *, into: Any = None, **kwargs: Any) -> Any:
        """The JSON answer of `method path` under `prefix` (None for an empty one), decoded
        `into` that type when one is given (a `client.types` struct, a list of them); query
        `params` that are None are left out. Raises `ApiError` saying why not."""
        url = f"{self.base_url}{self.prefix}{path}"
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
            message = f"cannot reach {self.service} at {self.base_url}: {reason}"
            raise ApiUnreachable(message, **where, status=None, reason=reason) from exc
        if not response.is_success:
            reason = self.error_reason(response)
            message = f"{method} {path}: HTTP {response.status_code}: {reason}"
            raise ApiError(message, **where, status=response.status_code, reason=reason)
        if into is None:
            return response.json() if response.content else None
        try:
            return msgspec.json.decode(response.content, type=into)
        except msgspec.DecodeError as exc:  # a ValidationError too: the field that did not fit
            reason = f"the answer is not the body the client knows: {exc}"
            message = f"{method} {path}: {reason}"
            raise ApiError(message, **where, status=response.status_code, reason=reason) from exc

    def error_reason(self, response: httpx.Response) -> str:
        """What a failed answer says was wrong; here its text (or the status's reason phrase),
        a service's client reads its own error body."""
        return body_text(response)


def body_text(response: httpx.Response) -> str:
    """A failed answer's text, cut to 300 characters (or the status's reason phrase)."""
    return response.text.strip()[:300] or response.reason_phrase
