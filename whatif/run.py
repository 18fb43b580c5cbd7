"""Replay a recording under other settings: the engine itself, on tokens made from hashes.

A recording has no tokens, only each request's chained unit hashes. `synthesize` turns every
unit hash into `unit` tokens that encode it (two 32-bit halves, then zeros), so two requests'
synthetic sequences agree on a unit exactly when their hashes do, and so at every multiple of
the unit exactly where the real prompts agreed. The tokens past the chain (a last partial unit)
are the request's own. The engine then runs them with the null runner, scripted to emit each
request's recorded output, so its later turns find those outputs cached as they did.

Requests enter at the step they arrived in (`arrival_step`), in arrival order, so a replay of
the engine's own settings schedules every chunk as the engine did and hits what it hit (the
agreement a what-if reports); without recorded steps they enter `concurrency` at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import NamedTuple

from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import NullSink
from engine.request import SamplingParams
from engine.runners.null import NullRunner
from engine.scheduling.outputs import RunnerOutput, ScheduledChunk
from engine.tiers.stack import DISK, HOST
from engine.traces.trace import TracePin, TraceRequest
from whatif.budget import Deadline, Limits, check, estimate, size_of
from whatif.recording import RecordedRequest, Recording
from whatif.report import SettingResult, WhatIfReport
from whatif.settings import WhatIfSetting, apply, check_memory, ran_configs
from whatif.tiers import default_unit_bytes, model_stack
from workloads.bound import Budget, bound
from workloads.oracle import oracle

_HALF = 0xFFFFFFFF
_TAIL = 1 << 31  # the tokens past a chain count down from here, apart from any unit's


def unit_tokens(unit_hash: int, unit: int) -> list[int]:
    """The `unit` tokens standing for one unit hash: its two 32-bit halves, then zeros (one
    token, folding both halves, when the unit is a single token)."""
    bits = unit_hash & 0xFFFFFFFFFFFFFFFF
    if unit == 1:
        return [(bits ^ (bits >> 32)) & _HALF]
    return [bits & _HALF, bits >> 32] + [0] * (unit - 2)


def synthesize(request: RecordedRequest, unit: int) -> list[int]:
    """A sequence of the request's prompt + output length whose units are its hashes."""
    length = request.num_prompt_tokens + request.num_output_tokens
    tokens: list[int] = []
    for unit_hash in request.units:
        if len(tokens) + unit > length:
            break
        tokens.extend(unit_tokens(unit_hash, unit))
    tail = length - len(tokens)
    tokens.extend(_TAIL - (request.arrival_index * unit + i) % _TAIL for i in range(tail))
    return tokens


class ScriptedRunner(NullRunner):
    """The null runner's work (none) with each request's output read from its script."""

    def __init__(
        self,
        scripts: dict[str, list[int]],
        model_config: ModelConfig | None = None,
        unit_bytes: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(model_config or ModelConfig())
        self.scripts = scripts
        self._bytes = unit_bytes  # a tier unit's bytes per token and per state

    def unit_bytes(self) -> tuple[int, int]:
        """As given, else the built-in model's (read once a process, when a tier needs it)."""
        if self._bytes is None:
            self._bytes = default_unit_bytes()
        return self._bytes

    def forward(self, chunks: list[ScheduledChunk]) -> RunnerOutput:
        sampled = {}
        for chunk in chunks:
            if chunk.sample:
                script = self.scripts[chunk.request_id]
                sampled[chunk.request_id] = script[chunk.end] if chunk.end < len(script) else 0
        return RunnerOutput(sampled=sampled)


class Replayed(NamedTuple):
    """A replay's hit for every request (pins left out) and the most in flight at once."""

    hits: list[int]
    max_in_flight: int
    unplaced: dict[str, str] = {}  # pin id -> why this setting could not place it
    # each request's hit tokens past the device's, by tier (`Request.hit_tokens_by_medium`)
    by_medium: list[dict[str, int]] = []


class Synthetic(NamedTuple):
    """The recording's requests as the engine takes them."""

    items: list[TracePin | TraceRequest]
    outputs: dict[str, list[int]]  # request id -> its output tokens
    scripts: dict[str, list[int]]  # request id -> its whole sequence
    names: dict[str, str]  # pin id -> the pin's name as its user knows it (its label)


def synthetic(recording: Recording) -> Synthetic:
    items: list[TracePin | TraceRequest] = []
    outputs, scripts, names = {}, {}, {}
    for line, request in enumerate(recording.requests, 1):
        tokens = synthesize(request, recording.unit)
        prompt = tokens[: request.num_prompt_tokens]
        if request.pin:
            items.append(TracePin(line, request.id, prompt, None))
            names[request.id] = request.name or request.id
            continue
        offsets = tuple(p for p in request.checkpoint_offsets if 0 < p <= len(prompt))
        items.append(
            TraceRequest(
                line, request.id, prompt, max(1, request.num_output_tokens), None, 1.0, 1.0,
                None, offsets,
            )
        )  # fmt: skip
        outputs[request.id] = tokens[request.num_prompt_tokens :]
        scripts[request.id] = tokens
    return Synthetic(items, outputs, scripts, names)


def replay_setting(
    recording: Recording,
    cache: CacheConfig,
    scheduler: SchedulerConfig,
    progress: Callable[[int], None] | None = None,
    prepared: Synthetic | None = None,
    deadline: Deadline | None = None,
    tiers: tuple[int, int] = (0, 0),
    unit_bytes: tuple[int, int] | None = None,
) -> Replayed:
    """Run the recording through an engine with these configs, and host memory and a disk
    of `tiers` bytes below it (`whatif.tiers`; units of `unit_bytes` per token and per state,
    default the built-in model's); `progress(n)` after every `n` requests finished;
    `deadline` checked at every step (`WhatIfTimedOut` past it)."""
    prepared = prepared or synthetic(recording)
    runner = ScriptedRunner(prepared.scripts, unit_bytes=unit_bytes)
    stack = model_stack(*tiers)
    engine = Engine(
        cache, scheduler, ModelConfig(), runner=runner, sink=NullSink(), tier_stack=stack
    )
    hits: dict[str, int] = {}
    by_medium: dict[str, dict[str, int]] = {}
    unplaced: dict[str, str] = {}
    most = 0
    in_flight = 0
    for finished in _run(engine, recording, prepared, unplaced):
        if deadline is not None:
            deadline.check()
        in_flight = len(engine.scheduler.requests)
        most = max(most, in_flight)
        for request in finished:
            if request.pin_id is None:
                hits[request.request_id] = request.num_cached_tokens or 0
                by_medium[request.request_id] = dict(request.hit_tokens_by_medium)
        if progress is not None and finished:
            progress(len(finished))
    ids = [r.id for r in recording.requests if not r.pin]
    return Replayed([hits[i] for i in ids], most, unplaced, [by_medium[i] for i in ids])


def _run(
    engine: Engine, recording: Recording, prepared: Synthetic, unplaced: dict[str, str]
) -> Iterator[list]:
    """Add the requests where they arrived and step the engine; yields each step's finished
    requests (after the step, with the newly added ones in flight). A pin the engine cannot
    place goes into `unplaced` with the reason, and the replay goes on without it."""
    items = prepared.items
    window = recording.concurrency
    next_item = 0
    after_pin = False  # a pin's prefill runs alone, as `junction replay` runs a pin line
    while next_item < len(items) or engine.has_unfinished():
        if window is None:
            now = engine.scheduler.step_id
            while next_item < len(items) and _arrival_step(recording, next_item) <= now:
                _submit(engine, items[next_item], unplaced)
                next_item += 1
        elif not (after_pin and engine.has_unfinished()):
            after_pin = False
            while next_item < len(items):
                item = items[next_item]
                if isinstance(item, TracePin):
                    if engine.has_unfinished():
                        break
                    after_pin = True
                elif len(engine.scheduler.requests) >= window:
                    break
                _submit(engine, item, unplaced)
                next_item += 1
                if after_pin:
                    break
        yield engine.step()


def _arrival_step(recording: Recording, index: int) -> int:
    step = recording.requests[index].arrival_step
    if step is None:
        raise ValueError(
            f"request {recording.requests[index].id!r} has no recorded arrival step: replay "
            "the recording with a concurrency instead"
        )
    return step


def _submit(engine: Engine, item: TracePin | TraceRequest, unplaced: dict[str, str]) -> None:
    if isinstance(item, TracePin):
        try:
            engine.pin(item.pin_id, item.token_ids)
        except ValueError as exc:  # as a live engine refuses it: the traffic goes on without
            unplaced[item.pin_id] = str(exc).removeprefix(f"pin {item.pin_id!r}: ")
        return
    engine.add_request(
        item.token_ids,
        SamplingParams(max_tokens=item.max_tokens),
        item.request_id,
        checkpoint_offsets=item.checkpoint_offsets,
    )


def _result(
    setting: WhatIfSetting,
    cache: CacheConfig,
    replayed: Replayed,
    prepared: Synthetic,
) -> SettingResult:
    unit = cache.match_unit
    # a pin the setting could not place never ran: the oracle and the bound go without it too
    items = [
        item
        for item in prepared.items
        if not (isinstance(item, TracePin) and item.pin_id in replayed.unplaced)
    ]
    requests = [item for item in items if isinstance(item, TraceRequest)]
    best = oracle(items, unit, cache.eagle, prepared.outputs)
    # the bound drops pin lines: a pin's prefill enters it as a request of its own, which the
    # offline policy may keep as the engine keeps the pin, and whose hit is not counted
    pins = {item.pin_id for item in items if isinstance(item, TracePin)}
    offline = bound(
        [_as_request(item) for item in items],
        unit,
        cache.attention_block_size,
        Budget(cache.num_blocks, cache.mamba_num_blocks),
        max(1, replayed.max_in_flight),
        cache.eagle,
        prepared.outputs,
        cache.mamba_block_size,
    )
    bound_tokens = sum(h.num_bound_tokens for h in offline.hits if h.request_id not in pins)
    return SettingResult(
        label=setting.name(),
        changes=setting.changes(),
        config=asdict(cache),
        num_prompt_tokens=sum(len(r.token_ids) for r in requests),
        hit_tokens=sum(replayed.hits),
        oracle_tokens=best.num_oracle_tokens,
        bound_tokens=bound_tokens,
        hits=replayed.hits,
        host_hit_tokens=sum(t.get(HOST, 0) for t in replayed.by_medium),
        disk_hit_tokens=sum(t.get(DISK, 0) for t in replayed.by_medium),
        tier_hits=[[t.get(HOST, 0), t.get(DISK, 0)] for t in replayed.by_medium],
        pins_not_placed=[
            {"pin": prepared.names[pin_id], "reason": reason}
            for pin_id, reason in replayed.unplaced.items()
        ],
    )


def check_fits(recording: Recording, cache: CacheConfig, label: str) -> None:
    """`ValueError` naming the setting when its pools could not hold the recording's longest
    request even alone (what the engine would refuse it for)."""
    longest = max(
        (
            r.num_prompt_tokens + max(1, r.num_output_tokens)
            for r in recording.requests
            if not r.pin
        ),
        default=0,
    )
    pins = [r.num_prompt_tokens for r in recording.requests if r.pin]
    check_memory(cache, longest, pins, label)


def _as_request(item: TracePin | TraceRequest) -> TraceRequest:
    if isinstance(item, TraceRequest):
        return item
    return TraceRequest(item.line, item.pin_id, item.token_ids, 1, None, 1.0, 1.0, None)


def run_whatif(
    recording: Recording,
    settings: Sequence[WhatIfSetting],
    progress: Callable[[int, int], None] | None = None,
    base: tuple[CacheConfig, SchedulerConfig] | None = None,
    limits: Limits | None = None,
) -> WhatIfReport:
    """Replay `recording` with its own settings, then with each of `settings`;
    `progress(done, total)` counts the requests replayed over all of them. A setting that
    cannot be tried raises `ValueError` naming it before anything runs; so does a run whose
    estimate is over `limits` (`whatif.budget.WhatIfTooLarge`), and one that runs past
    `limits.max_seconds` is stopped (`WhatIfTimedOut`).

    A bridged peer's recording (`geometry.kind`) has no Junction settings of its own: its
    recorded hits stand as what ran, unreplayed, and each setting applies to `base` (default:
    Junction's defaults)."""
    peer = recording.geometry.kind if recording.geometry.is_peer else None
    if peer is not None:
        ran_cache, ran_scheduler = base or (CacheConfig(), SchedulerConfig())
    else:
        ran_cache, ran_scheduler = ran_configs(recording.geometry)
    configs = [apply(setting, ran_cache, recording.unit) for setting in settings]
    for setting, cache in zip(settings, configs, strict=True):
        check_fits(recording, cache, setting.name())
    deadline = None
    if limits is not None:
        named = [(s.name(), c) for s, c in zip(settings, configs, strict=True)]
        named += [] if peer is not None else [("as ran", ran_cache)]
        check(estimate(size_of(recording), named), limits, len(named))
        deadline = Deadline(limits.max_seconds)
    prepared = synthetic(recording)
    total = recording.num_requests * (len(configs) + (peer is None))
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    recorded = [r.num_cached_tokens for r in recording.requests if not r.pin]
    if peer is not None:
        as_ran_setting = WhatIfSetting(label=f"{peer} as recorded")
        replayed = Replayed(recorded, 1)
    else:
        as_ran_setting = WhatIfSetting(label="as ran")
        replayed = replay_setting(recording, ran_cache, ran_scheduler, advance, prepared, deadline)
    as_ran = _result(as_ran_setting, ran_cache, replayed, prepared)
    results = []
    for setting, cache in zip(settings, configs, strict=True):
        replayed = replay_setting(
            recording, cache, ran_scheduler, advance, prepared, deadline,
            setting.tier_bytes(), setting.unit_bytes(),
        )  # fmt: skip
        results.append(_result(setting, cache, replayed, prepared))
    return WhatIfReport(
        num_requests=recording.num_requests,
        num_prompt_tokens=recording.num_prompt_tokens,
        recorded_tokens=sum(recorded),
        agreement=sum(a == b for a, b in zip(as_ran.hits, recorded, strict=True)),
        as_ran=as_ran,
        results=results,
        peer=peer,
    )
