"""Run a workload against a live `junction serve` through its OpenAI API.

Each request goes to `/v1/completions` with its prompt as token ids (and its
`checkpoint_offsets`) and `stream: true`, or, for a chat workload, to `/v1/chat/completions`
with its messages (the server renders them as the trace did); TTFT is the time to the first
streamed chunk that carries text (or the finish), and the hit length is the final chunk's
`usage.prompt_tokens_details.cached_tokens`. The server's cache configuration is whatever it
was started with, so modes do not apply: the result has one row, mode `engine`. Requests are
sent in trace order with at most `concurrency` in flight, and, when the workload sets a
`request_rate`, no earlier than their Poisson arrival times. Pin lines are not sent (pins go
through the control plane).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.run import BenchmarkError, timings, workload_summary
from bench.spec import BenchmarkSpec
from engine.traces.trace import TraceRequest
from workloads import oracle
from workloads.base import SegmentSource

Progress = Callable[[float, str], None]


@dataclass
class RemoteResult:
    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    ttft_s: float


def run_remote(
    spec: BenchmarkSpec, url: str, progress: Progress | None = None, timeout_s: float = 600.0
) -> dict:
    """The workload of `spec` against the server at `url`; the same result shape as
    `run_benchmark`, with one row of mode `engine` (and null for what a client cannot see)."""
    report = progress or (lambda fraction, message: None)
    workload = spec.workload.build()
    items = [i for i in workload.items() if isinstance(i, TraceRequest)]
    base = url.rstrip("/")
    report(0.0, f"{spec.name}: {len(items)} requests to {base}")
    started = time.perf_counter()
    results = asyncio.run(_send_all(spec, base, items, report, timeout_s, workload.messages))
    wall_s = time.perf_counter() - started
    truth = oracle(items, spec.geometry.match_unit, spec.geometry.eagle)
    num_prompt = sum(r.num_prompt_tokens for r in results)
    num_cached = sum(r.num_cached_tokens for r in results)
    num_output = sum(r.num_output_tokens for r in results)
    row = {
        "mode": "engine",
        "num_requests": len(results),
        "num_prompt_tokens": num_prompt,
        "num_cached_tokens": num_cached,
        "hit_rate": num_cached / num_prompt if num_prompt else 0.0,
        "oracle_hit_rate": truth.hit_rate,
        "computed_tokens": num_prompt - num_cached,  # what the hit left; recomputation unseen
        "forward_passes": None,
        "cow_copies": None,
        **timings([r.ttft_s for r in results], num_prompt, num_output, wall_s),
        "peak_blocks_used": None,
    }
    report(1.0, f"{spec.name}: done")
    return {
        "name": spec.name,
        "runner": "engine",
        "engine_url": base,
        "note": "run against a live engine: its own cache configuration applies, so the spec's "
        "modes and geometry do not (the oracle uses the spec's match unit and EAGLE setting)",
        "concurrency": spec.concurrency,
        "geometry": spec.geometry.model_dump(mode="json"),
        "match_unit": spec.geometry.match_unit,
        "modes": [row],
        "oracle": truth.as_dict(),
        "oracle_with_pins": truth.as_dict(),
        "workload": workload_summary(spec, workload),
    }


async def _send_all(
    spec: BenchmarkSpec,
    base: str,
    items: list[TraceRequest],
    report: Progress,
    timeout_s: float,
    messages: dict[str, list[dict[str, str]]] | None = None,
) -> list[RemoteResult]:
    import httpx  # only this path talks to a server

    rate = spec.workload.request_rate
    arrivals = (
        SegmentSource(spec.workload.seed).arrivals(len(items), rate) if rate else [0.0] * len(items)
    )
    slots = asyncio.Semaphore(spec.concurrency)
    results: list[RemoteResult | None] = [None] * len(items)
    done = 0
    limits = httpx.Limits(max_connections=spec.concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=timeout_s, limits=limits) as client:
        model = await _model_name(client)
        start = time.perf_counter()

        async def one(index: int, item: TraceRequest) -> None:
            nonlocal done
            chat = (messages or {}).get(item.request_id)
            results[index] = await _complete(client, model, item, chat)
            done += 1
            report(done / len(items), f"engine: {done}/{len(items)} requests")

        tasks = []
        for index, item in enumerate(items):
            await slots.acquire()  # in trace order, at most `concurrency` in flight
            delay = arrivals[index] - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(index, item))
            task.add_done_callback(lambda _: slots.release())
            tasks.append(task)
        await asyncio.gather(*tasks)
    return [r for r in results if r is not None]


async def _model_name(client) -> str:
    import httpx

    try:
        response = await client.get("/v1/models")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise BenchmarkError(
            f"cannot list the models of the engine at {client.base_url}: {exc}"
        ) from exc


async def _complete(
    client, model: str, item: TraceRequest, messages: list[dict[str, str]] | None = None
) -> RemoteResult:
    body: dict = {
        "model": model,
        "max_tokens": item.max_tokens,
        "temperature": item.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if messages is not None:
        path, body["messages"] = "/v1/chat/completions", messages
    else:
        path, body["prompt"] = "/v1/completions", item.token_ids
        if item.checkpoint_offsets:
            body["checkpoint_offsets"] = list(item.checkpoint_offsets)
    sent = time.perf_counter()
    first: float | None = None
    usage: dict | None = None
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")[:500]
            raise BenchmarkError(
                f"request {item.request_id}: the engine answered {response.status_code}: {detail}"
            )
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                message = chunk["error"].get("message", chunk["error"])
                raise BenchmarkError(f"request {item.request_id}: the engine failed: {message}")
            if first is None and any(_has_output(c) for c in chunk.get("choices") or []):
                first = time.perf_counter()
            if chunk.get("usage"):
                usage = chunk["usage"]
    if usage is None:
        raise BenchmarkError(f"request {item.request_id}: the engine sent no usage")
    details = usage.get("prompt_tokens_details") or {}
    return RemoteResult(
        request_id=item.request_id,
        num_prompt_tokens=usage["prompt_tokens"],
        num_cached_tokens=details.get("cached_tokens") or 0,
        num_output_tokens=usage.get("completion_tokens", 0),
        ttft_s=(first or time.perf_counter()) - sent,
    )


def _has_output(choice: dict) -> bool:
    """A streamed choice with text (or the finish): a chat stream opens with a role-only delta
    sent before any token, which TTFT must not count."""
    delta = choice.get("delta")
    text = choice.get("text") if delta is None else delta.get("content")
    return bool(text) or choice.get("finish_reason") is not None
