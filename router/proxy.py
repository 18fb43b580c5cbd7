"""`Proxy`: a request sent to the engine the fleet chose, with failover, and its answer relayed.

An engine that refuses the connection has not seen the request: it is marked down and the
request is routed again among the others. Once a request has been sent it is never sent
again: an engine that fails under it answers the client 502 (or, mid-stream, an error event).
Before the answer's end reaches the client, the proxy waits (briefly: `--finish-wait-s`) for
the engine's feed to report the request finished, so the index holds what it stored before the
client's next turn (not for a bridged peer's feed, which names no requests:
`FleetEngine.reports_finished`); past the wait, the fleet's expectations keep the prefix.
Requests go to the engine's `openai_url`: a bridged peer's own server, whose feed is the
bridge's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
from fastapi.responses import JSONResponse, Response, StreamingResponse

from protocol.errors import OpenAIError, anthropic_body
from protocol.sse import DONE, event
from router.caches.branches import with_hint
from router.engines import DEFAULT_READ_TIMEOUT_S, FINISH_WAIT_S, FleetEngine
from router.fleet import Decision, Fleet, NoEngineError
from router.metrics import RouterMetrics

SERVER_ERROR = "server_error"


def _cached_tokens(usage: dict | None) -> int | None:
    details = (usage or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return cached if isinstance(cached, int) else None


def _cache_read_tokens(usage: dict | None) -> int | None:
    """The hit of an Anthropic answer's usage."""
    read = (usage or {}).get("cache_read_input_tokens")
    return read if isinstance(read, int) else None


class Proxy:
    def __init__(
        self,
        fleet: Fleet,
        metrics: RouterMetrics,
        client: httpx.AsyncClient,
        finish_wait_s: float = FINISH_WAIT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    ) -> None:
        self.read_timeout_s = read_timeout_s
        self.fleet = fleet
        self.metrics = metrics
        self.client = client
        self.finish_wait_s = finish_wait_s

    async def forward(
        self,
        path: str,
        body: dict,
        token_ids: list[int],
        model: str,
        stream: bool,
        num_tokens_held: int = 0,
        cache_key: str | None = None,
        anthropic: bool = False,
    ) -> Response:
        """Route and send `body` to `path` of the chosen engine (one that takes
        `num_tokens_held` prompt + output tokens; `cache_key`, the `prompt_cache_key`, steers
        it); the engine's answer, or an error naming what went wrong. `anthropic`: the body
        is a Messages request, whose answers and stream are Anthropic's."""
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if stream and not anthropic:  # Anthropic's stream always carries its usage
            body = {**body, "stream_options": {"include_usage": True}}  # the realised hit
        refused: list[str] = []
        while True:
            decision = self._route(token_ids, model, refused, num_tokens_held, cache_key)
            engine = self.fleet.engines[decision.url]
            sent = with_hint(body, decision.branch_hint)
            request = self.client.build_request("POST", engine.openai_url + path, json=sent)
            try:  # returns at the answer's head: the body is read below
                response = await self.client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self._fail_over(decision, engine, f"refused the connection: {exc}", refused)
                continue
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                reason = f"closed the connection without a byte of an answer: {exc!r}"
                self._fail_over(decision, engine, reason, refused)
                continue
            except httpx.ReadTimeout as exc:
                raise self._failed(decision, self._silent()) from exc
            except httpx.HTTPError as exc:
                raise self._failed(decision, f"failed under the request: {exc!r}") from exc
            break
        if not stream:
            try:
                await response.aread()
            except httpx.ReadTimeout as exc:
                raise self._failed(decision, self._silent()) from exc
            except httpx.HTTPError as exc:
                raise self._failed(decision, f"failed while answering: {exc!r}") from exc
        if response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            self.fleet.fail(decision, f"answered HTTP {response.status_code}")
            return Response(
                content,
                response.status_code,
                media_type=response.headers.get("content-type", "application/json"),
            )
        headers = {"X-Junction-Engine": decision.url, "X-Junction-Route-Id": decision.request_id}
        if decision.engine_id is not None:  # the engine's name, as `GET /fleet` and the pages
            headers["X-Junction-Engine-Id"] = decision.engine_id
        if stream:
            relay = (
                self._relay_anthropic(response, decision, engine)
                if anthropic
                else self._relay(response, decision, engine, wants_usage)
            )
            return StreamingResponse(
                relay,
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            data = response.json()
        except ValueError as exc:
            raise self._failed(decision, "answered with a body that is not JSON") from exc
        usage = data.get("usage")
        realised = _cache_read_tokens(usage) if anthropic else _cached_tokens(usage)
        await self._finish(decision, engine, data.get("id"), realised)
        return JSONResponse(data, headers=headers)

    def _route(
        self,
        token_ids: list[int],
        model: str,
        refused: list[str],
        num_tokens_held: int,
        cache_key: str | None,
    ) -> Decision:
        try:
            decision = self.fleet.route(
                token_ids, model, refused, num_tokens_held, cache_key=cache_key
            )
        except NoEngineError:
            if refused:
                raise OpenAIError(
                    f"every engine serving {model!r} refused the connection "
                    f"({', '.join(refused)}); the request was not sent",
                    503,
                    code="no_engine",
                    type=SERVER_ERROR,
                ) from None
            raise OpenAIError(
                f"no engine serving {model!r} is up: see GET /fleet for each engine's state",
                503,
                code="no_engine",
                type=SERVER_ERROR,
            ) from None
        self.metrics.routed(decision)
        return decision

    def _fail_over(
        self, decision: Decision, engine: FleetEngine, reason: str, refused: list[str]
    ) -> None:
        """The engine never took the request: out for a while, and the request goes on."""
        self.fleet.fail(decision, reason)
        engine.mark_unreachable(reason)
        self.metrics.failovers.labels(decision.url).inc()
        refused.append(decision.url)

    def _silent(self) -> str:
        return f"sent nothing for {self.read_timeout_s:g} s (the router's --read-timeout)"

    def _failed(self, decision: Decision, reason: str) -> OpenAIError:
        self.fleet.fail(decision, reason)
        self.metrics.failures.labels(decision.url).inc()
        return OpenAIError(
            f"engine {decision.url} {reason}; the request is not retried (it was sent)",
            502,
            code="engine_failed",
            type=SERVER_ERROR,
        )

    async def _finish(
        self,
        decision: Decision,
        engine: FleetEngine,
        engine_request_id: str | None,
        realised: int | None,
    ) -> None:
        if isinstance(engine_request_id, str):
            self.fleet.started(decision, engine_request_id)
            if engine.reports_finished and self.finish_wait_s > 0:
                await engine.wait_finished(engine_request_id, self.finish_wait_s)
        self.fleet.finish(decision, realised)
        self.metrics.finished(decision)

    async def _relay(
        self,
        response: httpx.Response,
        decision: Decision,
        engine: FleetEngine,
        wants_usage: bool,
    ) -> AsyncIterator[str]:
        realised = None
        engine_request_id = None
        finished = False
        try:
            try:
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    payload = line.removeprefix("data: ")
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    if engine_request_id is None and isinstance(chunk.get("id"), str):
                        engine_request_id = chunk["id"]
                        self.fleet.started(decision, engine_request_id)
                    if "usage" in chunk and not chunk.get("choices"):
                        realised = _cached_tokens(chunk["usage"])
                        if not wants_usage:
                            continue
                    yield f"data: {payload}\n\n"
            except (httpx.HTTPError, ValueError) as exc:
                why = self._silent() if isinstance(exc, httpx.ReadTimeout) else f"{exc!r}"
                error = self._failed(decision, f"failed mid-stream: {why}")
                yield event(error.body())
                yield DONE
                return
            await self._finish(decision, engine, engine_request_id, realised)
            finished = True
            yield DONE
        finally:
            await response.aclose()
            if not finished and decision.status == "routed":
                self.fleet.fail(decision, "the client left before the end")

    async def _relay_anthropic(
        self, response: httpx.Response, decision: Decision, engine: FleetEngine
    ) -> AsyncIterator[str]:
        """Anthropic's stream, each event as the engine sent it: `message_start` names the
        engine's request and its hit; before `message_stop` reaches the client the request is
        finished (as `[DONE]` for OpenAI's)."""
        realised = stop = None
        finished = False
        try:
            try:
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue  # each event's `event:` line is its data's `type`
                    data = json.loads(line.removeprefix("data: "))
                    kind = data.get("type")
                    if kind == "message_start":
                        message = data.get("message") or {}
                        realised = _cache_read_tokens(message.get("usage"))
                        if isinstance(message.get("id"), str):
                            self.fleet.started(decision, message["id"])
                    if kind == "message_stop":
                        stop = data
                        break
                    yield f"event: {kind}\n{event(data)}"
            except (httpx.HTTPError, ValueError) as exc:
                why = self._silent() if isinstance(exc, httpx.ReadTimeout) else f"{exc!r}"
                error = self._failed(decision, f"failed mid-stream: {why}")
                body = anthropic_body(error.message, error.status_code)
                yield f"event: error\n{event(body)}"
                return
            await self._finish(decision, engine, decision.engine_request_id, realised)
            finished = True
            if stop is not None:  # else the engine's own `error` event ended it
                yield f"event: message_stop\n{event(stop)}"
        finally:
            await response.aclose()
            if not finished and decision.status == "routed":
                self.fleet.fail(decision, "the client left before the end")
