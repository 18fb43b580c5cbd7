"""Engines found through the control plane: every connected engine whose hello names the URL
it serves at (`model.serve_url`, which `junction serve` sets), polled every `interval_s` so
engines that start later join the fleet. Engines that leave stay listed (down) until they come
back: a router never forgets an engine it routed to."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

log = logging.getLogger(__name__)

DISCOVERY_INTERVAL_S = 5.0


async def discover(base_url: str, token: str, timeout_s: float = 5.0) -> list[str]:
    """The serve URLs of the control plane's connected engines; `httpx.HTTPError` or
    `ValueError` (naming what was wrong) when it cannot say."""
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        response = await client.get(
            base_url.rstrip("/") + "/api/v1/engines",
            headers={"Authorization": f"Bearer {token}"},
        )
    if response.status_code != 200:
        raise ValueError(
            f"the control plane at {base_url} answered HTTP {response.status_code} to "
            "GET /api/v1/engines (is JUNCTION_API_TOKEN its token?)"
        )
    urls = []
    for engine in response.json():
        url = (engine.get("model") or {}).get("serve_url")
        if engine.get("connected") and isinstance(url, str) and url.startswith("http"):
            urls.append(url.rstrip("/"))
    return sorted(set(urls))


async def keep_discovering(
    base_url: str, token: str, add: Callable[[str], None], interval_s: float = DISCOVERY_INTERVAL_S
) -> None:
    while True:
        try:
            for url in await discover(base_url, token):
                add(url)
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("engine discovery through %s failed: %s", base_url, exc)
        await asyncio.sleep(interval_s)
