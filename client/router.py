"""`junction route`'s REST API as its clients use it (the dashboard's Fleet page): its fleet and
its routing decisions, read with a bearer token over the transport the control plane's client
shares (`client.transport`), every failure an `ApiError`.

The router answers a failure the OpenAI way, `{"error": {"message"}}`: that message is the
error's `reason`. Where the router is and the token to send are the caller's;
`client.settings` reads them from the environment (`JUNCTION_ROUTER_URL`).
"""

from __future__ import annotations

import httpx

from client.transport import JsonClient, body_text
from client.types import Decision, DecisionPage, FleetView


class RouterClient(JsonClient):
    """One router at `base_url`; every call sends `token` as a bearer token."""

    service = "the router"

    def fleet(self) -> FleetView:
        """Each engine's state, keys, load and share; the policy and its agreement."""
        return self.call("GET", "/fleet", into=FleetView)

    def decisions(self, limit: int = 100) -> list[Decision]:
        """The latest routing decisions (at most 1000), newest first."""
        params = {"limit": limit}
        return self.call("GET", "/fleet/decisions", params=params, into=DecisionPage).decisions

    def decision(self, request_id: str) -> Decision:
        """One decision, by the router's id or the engine's completion id."""
        return self.call("GET", f"/fleet/decisions/{request_id}", into=Decision)

    def error_reason(self, response: httpx.Response) -> str:
        """The router's OpenAI-style `error.message`, else the body's text."""
        try:
            return str(response.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            return body_text(response)
