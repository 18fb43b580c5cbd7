"""`junction replay`: run a trace through the engine and report every request.

Requests enter in trace order with at most `concurrency` in flight; a pin line waits for the
requests before it, then materializes its pin before the next line. Output lines come in trace
order, each as soon as it and every line before it are done, so a replay holds only the
requests in flight (`replay_records`); nothing is written unless the whole replay succeeds.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from engine.engine import Engine
from engine.pins import Pin
from engine.request import Request, SamplingParams
from engine.traces.trace import TraceItem, TracePin, TraceRequest


@dataclass
class ReplaySummary:
    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    wall_s: float = 0.0
    pins: list[dict] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    def add(self, record: dict) -> None:
        if record["type"] == "pin":
            self.pins.append(record)
            return
        self.num_requests += 1
        self.num_prompt_tokens += record["num_prompt_tokens"]
        self.num_cached_tokens += record["num_cached_tokens"]
        self.num_computed_tokens += record["num_computed_tokens"]
        self.num_preemptions += record["num_preemptions"]


def request_record(request: Request) -> dict:
    return {
        "type": "request",
        "id": request.request_id,
        "num_prompt_tokens": request.num_prompt_tokens,
        "num_cached_tokens": request.num_cached_tokens or 0,
        "hit_tokens_by_group": dict(request.hit_tokens_by_group),
        "hit_tokens_by_medium": dict(request.hit_tokens_by_medium),
        "num_computed_tokens": request.num_prefill_computed,
        "chunks": [list(c) for c in request.chunks],
        "chunk_stop_reasons": list(request.chunk_stop_reasons),
        "checkpoints": list(request.checkpoints),
        "cow_copies": [copy.to_dict() for copy in request.cow_copies],
        "output_token_ids": list(request.output_token_ids),
        "ttft_s": request.ttft_s,
        "num_preemptions": request.num_preemptions,
        "finish_reason": request.finish_reason,
    }


def pin_record(pin: Pin) -> dict:
    return {
        "type": "pin",
        "id": pin.pin_id,
        "state": pin.state.value,
        "num_tokens": pin.num_tokens,
        "boundary": pin.boundary,
        "reason": pin.reason,
        "block_ids": {g: list(ids) for g, ids in pin.block_ids.items()},
    }


def replay(
    engine: Engine,
    items: Iterable[TraceItem],
    concurrency: int = 1,
    on_step: Callable[[Engine], None] | None = None,
    on_item: Callable[[TraceItem], None] | None = None,
) -> tuple[list[dict], ReplaySummary]:
    """Run `items`; `on_step` runs after every engine step (tests check invariants there)."""
    summary = ReplaySummary()
    records = list(replay_records(engine, items, summary, concurrency, on_step, on_item))
    return records, summary


def replay_records(
    engine: Engine,
    items: Iterable[TraceItem],
    summary: ReplaySummary,
    concurrency: int = 1,
    on_step: Callable[[Engine], None] | None = None,
    on_item: Callable[[TraceItem], None] | None = None,
) -> Iterator[dict]:
    """Run `items`, yielding each line's record in trace order as soon as it and the lines
    before it are done; `summary` is complete once the iterator is exhausted."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    started = time.perf_counter()
    # records not yet yielded, in trace order; an in-flight request's slot is None until done
    pending: deque[list[dict | None]] = deque()
    in_flight: dict[str, list[dict | None]] = {}

    def step() -> None:
        for request in engine.step():
            slot = in_flight.pop(request.request_id, None)
            if slot is not None:
                slot[0] = request_record(request)
        summary.num_steps += 1
        if on_step is not None:
            on_step(engine)

    def drain(limit: int) -> None:
        while len(in_flight) > limit or (limit == 0 and engine.has_unfinished()):
            step()

    def ready() -> Iterator[dict]:
        while pending and pending[0][0] is not None:
            record = pending.popleft()[0]
            summary.add(record)
            yield record

    for item in items:
        if isinstance(item, TracePin):
            drain(0)
            pin = engine.pin(item.pin_id, item.token_ids, item.cache_salt)
            drain(0)
            pending.append([pin_record(pin)])
        else:
            drain(concurrency - 1)
            _submit(engine, item)
            slot: list[dict | None] = [None]
            in_flight[item.request_id] = slot
            pending.append(slot)
        if on_item is not None:
            on_item(item)
        yield from ready()
    drain(0)
    yield from ready()
    summary.wall_s = time.perf_counter() - started


def _submit(engine: Engine, item: TraceRequest) -> Request:
    sampling = SamplingParams(
        max_tokens=item.max_tokens, temperature=item.temperature, top_p=item.top_p, seed=item.seed
    )
    try:
        return engine.add_request(
            item.token_ids, sampling, item.request_id, item.cache_salt, item.checkpoint_offsets
        )
    except ValueError as exc:
        raise ValueError(f"line {item.line}: {exc}") from exc


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[TextIO]:
    """A file handle whose content lands at `path` whole or not at all: a temp file beside it,
    renamed when the block completes, removed when it raises. A device or pipe (`/dev/null`, a
    FIFO) is written directly."""
    target = Path(path)
    if target.exists() and not target.is_file():
        with target.open("w", encoding="utf-8") as handle:
            yield handle
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_atomically(path: str | Path, lines: Iterable[str]) -> None:
    """Write a file whole or not at all (`atomic_output`), consuming `lines` as it goes."""
    with atomic_output(path) as handle:
        handle.writelines(lines)


def jsonl(records: Iterable[dict]) -> Iterable[str]:
    for record in records:
        yield json.dumps(record, separators=(",", ":")) + "\n"
