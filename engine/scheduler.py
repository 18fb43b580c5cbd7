"""The scheduler: waiting and running queues, a token budget, chunked prefill with boundary
stops, copy-on-write, preemption when blocks run out, and decode.

One step flows one way: `schedule()` (lookup, allocate, queue copies) -> the runner ->
`update()` (register entries, sample, finish) -> events.
"""

from __future__ import annotations

import itertools
import time
from collections import deque

from engine.cache.coordinator import ATTENTION, MAMBA, CacheHit, HybridCoordinator
from engine.cache.entry import CheckpointReason
from engine.cache.manager import BlockCopy
from engine.chunking import Chunk, checkpoint_targets, plan_chunk, state_positions
from engine.config import CacheConfig, SchedulerConfig
from engine.events import BlockCopied, BlockStateChanged, EventSink, RequestFinished
from engine.hashing import hash_prefix, num_shared_units
from engine.outputs import RunnerOutput, ScheduledChunk, SchedulerOutput
from engine.pins import Pin, PinState, materialize, release
from engine.request import Request, RequestStatus, SamplingParams

DECODE = "decode"
SIBLING_LOOKAHEAD = 64  # waiting requests an admitted one keeps junctions for
JUNCTION_RETENTION = CheckpointReason.JUNCTION.retention


class Scheduler:
    def __init__(
        self,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        sink: EventSink,
        medium: str = "GPU",
    ) -> None:
        self.cache_config = cache_config
        self.config = scheduler_config
        self.sink = sink
        self.is_recording = sink.is_recording
        self.coordinator = HybridCoordinator(cache_config, sink, medium)
        self.unit = cache_config.match_unit
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.pins: dict[str, Pin] = {}
        self.step_id = 0
        self._refused: list[Request] = []  # finished while scheduling: update() returns them
        # this step's interval states per request (position -> reason), registered by update()
        self._interval_positions: dict[str, dict[int, CheckpointReason]] = {}

    # ------------------------------------------------------------------ intake
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        if request.num_prompt_tokens == 0:
            raise ValueError(f"request {request.request_id!r} has an empty prompt")
        if not request.is_pin and request.sampling.max_tokens < 1:
            raise ValueError(f"request {request.request_id!r}: max_tokens must be >= 1")
        self._check_fits(request)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def _check_fits(self, request: Request) -> None:
        total = request.num_prompt_tokens + request.sampling.max_tokens
        if total > self.config.max_model_len:
            raise ValueError(
                f"request {request.request_id!r} has {total} prompt + output tokens; "
                f"max_model_len is {self.config.max_model_len}"
            )
        config = self.cache_config
        needs = {
            ATTENTION: -(-total // config.attention_block_size) + 1,
            MAMBA: -(-total // config.mamba_block_size) + 4 + len(self.pins),
        }
        for group, pool in self.coordinator.pools.items():
            usable = pool.num_blocks - pool.num_pinned
            if needs[group] > usable:
                raise ValueError(
                    f"request {request.request_id!r} ({total} tokens) may need {needs[group]} "
                    f"{group} blocks of {pool.block_size} tokens, but the pool has {usable} "
                    f"unpinned of {pool.num_blocks}: raise the number of blocks"
                )

    def abort_request(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
        self._finish(request, "abort")
        self._emit_block_states()
        return request

    def add_pin(self, pin_id: str, token_ids: list[int], cache_salt: str | None = None) -> Pin:
        """Queue a pin's materialization: a prefill of its prefix up to the boundary."""
        if pin_id in self.pins and self.pins[pin_id].is_active:
            raise ValueError(f"pin {pin_id!r} already exists; unpin it first")
        alignment = self.cache_config.hit_alignment
        boundary = len(token_ids) // alignment * alignment
        if boundary == 0:
            raise ValueError(
                f"pin {pin_id!r}: its {len(token_ids)} tokens floor to a boundary of 0 on this "
                f"engine's {alignment}-token hit grid; pin a prefix of at least {alignment} tokens"
            )
        prefix = list(token_ids[:boundary])
        key = hash_prefix(prefix, self.unit, cache_salt)[-1]
        pin = Pin(pin_id, len(token_ids), boundary, key)
        self.pins[pin_id] = pin
        if not self.cache_config.enable_prefix_caching:
            self._pin_failed(pin, "prefix caching is off on this engine")
            return pin
        request = Request(
            f"pin:{pin_id}",
            prefix,
            SamplingParams(max_tokens=0),
            self.unit,
            cache_salt,
            pin_id=pin_id,
        )
        self.add_request(request)
        self._emit_pin(pin)
        return pin

    def remove_pin(self, pin_id: str) -> Pin:
        pin = self.pins.get(pin_id)
        if pin is None:
            raise KeyError(f"no pin {pin_id!r}; known pins: {sorted(self.pins)}")
        self.abort_request(f"pin:{pin_id}")
        release(self.coordinator, pin)
        self._emit_pin(pin)
        self._emit_block_states()
        return pin

    # ------------------------------------------------------------------ schedule
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        self.step_id += 1
        coordinator = self.coordinator
        coordinator.begin_step(self.step_id)
        out = SchedulerOutput(self.step_id, new_block_ids={ATTENTION: [], MAMBA: []})
        budget = self.config.max_num_batched_tokens
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            chunk = self._plan(request, request.num_computed_tokens, budget)
            if chunk is None:
                index += 1
                continue
            positions = self._positions(request, request.num_computed_tokens, chunk.end)
            while not coordinator.can_allocate(
                coordinator.count_chunk(request.request_id, chunk.end, positions)
            ):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted_ids.append(victim.request_id)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                break
            budget -= self._schedule_chunk(out, request, chunk, positions)
            index += 1
        if not out.preempted_ids:
            self._admit_waiting(out, budget)
        self._add_interval_states(out)
        return out

    def _add_interval_states(self, out: SchedulerOutput) -> None:
        """Last in the step, once every chunk has its blocks: the spare interval states, so
        they take only what no chunk of this step needed."""
        self._interval_positions.clear()
        if not self.cache_config.state_interval:
            return
        coordinator = self.coordinator
        for chunk in out.chunks:
            writes = chunk.mamba_writes
            new_ids = coordinator.add_interval_states(chunk.start, chunk.end, writes)
            if not new_ids:
                continue
            out.new_block_ids[MAMBA].extend(new_ids)
            added = set(new_ids)
            self._interval_positions[chunk.request_id] = {
                position: CheckpointReason.INTERVAL
                for position, block_id in writes
                if block_id in added
            }

    def _plan(self, request: Request, start: int, budget: int) -> Chunk | None:
        if not request.is_prefilling or start >= request.prefill_target:
            return Chunk(request.num_tokens, DECODE)
        config, cache = self.config, self.cache_config
        return plan_chunk(
            start,
            min(budget, config.chunk_limit),
            request.num_tokens,
            cache.scheduler_block_size,
            config.chunk_limit,
            cache.eagle and not request.is_pin,
            request.targets,
            stops_at_checkpoints=cache.checkpoint_mode == "stops",
        )

    def _positions(self, request: Request, start: int, end: int) -> list[int]:
        return state_positions(
            start,
            end,
            self.cache_config.mamba_block_size,
            request.targets,
            inline=self.cache_config.checkpoint_mode == "inline",
        )

    def _targets(self, request: Request, junction: int | None) -> dict[int, CheckpointReason]:
        unit, hashes = self.unit, request.block_hashes
        if request.is_pin:
            # its own boundary; with partial hits also the resend checkpoint an exact resend of
            # the pinned prefix hits (every hit stops short of the whole prompt), cached, not
            # pinned, so it may be evicted like any other; and its junction, like any request's
            pins = [request.num_prompt_tokens]
        else:
            pins = [
                pin.boundary
                for pin in self.pins.values()
                if pin.is_active
                and pin.boundary <= request.num_prompt_tokens
                and hashes[pin.boundary // unit - 1] == pin.key
            ]
        cache = self.cache_config
        return checkpoint_targets(
            request.num_prompt_tokens,
            unit,
            cache.scheduler_block_size,
            cache.eagle,
            cache.partial_hits,
            junction,
            pins,
            request.checkpoint_offsets,
        )

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        coordinator, config = self.coordinator, self.cache_config
        index = 0  # waiting requests before it wait for a producer in flight
        while (
            index < len(self.waiting)
            and budget > 0
            and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting[index]
            hit = coordinator.lookup(
                request.block_hashes, request.num_tokens, needs_logits=not request.is_pin
            )
            if hit.is_pending:
                break  # its checkpoint is being copied this step: it hits next step
            if request.is_pin and hit.length >= request.num_tokens:
                del self.waiting[index]
                self._finish_pin(request)
                continue
            if self._waits_for_producer(request, hit):
                index += 1  # the requests behind it may go ahead
                continue
            junction = None
            if config.junction_checkpoints and hit.attention_length > hit.length:
                junction = hit.attention_length
            targets = self._targets(request, junction)
            self._keep_sibling_junctions(request, hit, targets)
            request.targets = targets
            request.prefill_target = request.num_tokens
            chunk = self._plan(request, hit.length, budget)
            if chunk is None:
                break
            positions = self._positions(request, hit.length, chunk.end)
            need = coordinator.count_admission(request.request_id, hit, chunk.end, positions)
            if not coordinator.can_allocate(need):
                if not self.running and not out.chunks:
                    del self.waiting[index]
                    self._finish(request, "capacity")
                    if not request.is_pin:
                        self._refused.append(request)
                    continue
                break
            del self.waiting[index]
            self._admit(out, request, hit)
            self.running.append(request)
            budget -= self._schedule_chunk(out, request, chunk, positions)

    # ------------------------------------------------------------------ in-flight sharing
    # A request that shares a prefix with one being prefilled now would recompute what the
    # other is about to register. It waits instead (bounded), and the producer keeps the state
    # where the two part, so the waiter hits it; a preempted or aborted producer leaves
    # `running` and so releases its waiters.

    def _shared_hit(self, request: Request, other: Request) -> int:
        """The hit `request` would get if everything it shares with `other` were cached."""
        shared = num_shared_units(request.block_hashes, other.block_hashes) * self.unit
        return self.coordinator.reachable_hit(shared, request.num_tokens)

    def _waits_for_producer(self, request: Request, hit: CacheHit) -> bool:
        """Whether `request` should wait for a prefilling request in flight that will register
        more of its prefix than is cached now; that producer then keeps the state there."""
        if (
            request.is_pin
            or not self.cache_config.junction_checkpoints
            or request.num_wait_steps >= self.config.max_prefix_wait_steps
        ):
            return False
        waits = False
        for producer in self.running:
            if producer.is_pin or not producer.is_prefilling:
                continue  # decoding: what it registered is already in the cache
            reachable = self._shared_hit(request, producer)
            if reachable <= hit.length or producer.num_registered_tokens >= reachable:
                continue
            self._keep_junction(producer.targets, reachable)
            waits = True
        if waits:
            request.num_wait_steps += 1
        return waits

    def _keep_sibling_junctions(
        self, request: Request, hit: CacheHit, targets: dict[int, CheckpointReason]
    ) -> None:
        """A request admitted while others that share its prefix wait keeps the state where
        each would stop hitting it: they arrive together and would otherwise all miss."""
        if request.is_pin or not self.cache_config.junction_checkpoints:
            return
        for sibling in itertools.islice(self.waiting, SIBLING_LOOKAHEAD):
            if sibling is request or sibling.is_pin:
                continue
            reachable = self._shared_hit(sibling, request)
            if hit.length < reachable < request.num_prompt_tokens:
                self._keep_junction(targets, reachable)

    def _keep_junction(self, targets: dict[int, CheckpointReason], position: int) -> None:
        cache = self.cache_config
        floor = self.unit if cache.partial_hits else cache.scheduler_block_size
        position = position // floor * floor
        current = targets.get(position)
        if position and (current is None or current.retention < JUNCTION_RETENTION):
            targets[position] = CheckpointReason.JUNCTION

    def _admit(self, out: SchedulerOutput, request: Request, hit: CacheHit) -> None:
        copies = self.coordinator.admit(request.request_id, hit)
        self._queue_copies(out, request, copies)
        if request.num_cached_tokens is None:
            request.num_cached_tokens = hit.length
            request.hit_tokens_by_group = hit.by_group
            request.pin_hits = {
                pin.pin_id: pin.boundary
                for pin in self.pins.values()
                if pin.state is PinState.MATERIALIZED
                and pin.boundary <= hit.length
                and request.block_hashes[pin.boundary // self.unit - 1] == pin.key
            }
        request.num_computed_tokens = hit.length
        request.num_registered_tokens = hit.length
        request.status = RequestStatus.RUNNING

    def _schedule_chunk(
        self, out: SchedulerOutput, request: Request, chunk: Chunk, positions: list[int]
    ) -> int:
        start, end = request.num_computed_tokens, chunk.end
        work = self.coordinator.allocate_chunk(request.request_id, start, end, positions)
        self._queue_copies(out, request, work.copies)
        for group, block_ids in work.new_block_ids.items():
            out.new_block_ids[group].extend(block_ids)
        if chunk.stop_reason != DECODE:
            request.chunks.append((start, end))
            request.chunk_stop_reasons.append(chunk.stop_reason)
            request.num_prefill_computed += end - start
        out.chunks.append(
            ScheduledChunk(
                request_id=request.request_id,
                token_ids=request.all_token_ids,
                start=start,
                end=end,
                attention_block_ids=work.attention_block_ids,
                mamba_read_block=work.mamba_read_block,
                mamba_writes=work.mamba_writes,
                sample=end == request.num_tokens and not request.is_pin,
                sampling=request.sampling,
                output_index=len(request.output_token_ids),
            )
        )
        return end - start

    def _queue_copies(
        self, out: SchedulerOutput, request: Request, copies: list[BlockCopy]
    ) -> None:
        pools = self.coordinator.pools
        for copy in copies:
            out.copies.append(copy)
            request.cow_copies.append(
                {
                    "group": copy.group,
                    "path": copy.path,
                    "src": copy.src,
                    "dst": copy.dst,
                    "position": copy.position,
                    "step": out.step,
                }
            )
            if not self.is_recording:
                continue
            self.sink.emit(
                BlockCopied(
                    group_idx=pools[copy.group].group_idx,
                    group=copy.group,
                    src_block_id=copy.src,
                    dst_block_id=copy.dst,
                    path=copy.path,
                    request_id=copy.request_id,
                    position=copy.position,
                    step=out.step,
                )
            )

    def _preempt(self, request: Request) -> None:
        self.coordinator.free_request(request.request_id)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_registered_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    # ------------------------------------------------------------------ update
    def update(self, out: SchedulerOutput, result: RunnerOutput) -> list[Request]:
        """Register what the step computed, take sampled tokens, and finish requests."""
        coordinator = self.coordinator
        finished, self._refused = self._refused, []
        now = time.time()
        for chunk in out.chunks:
            request = self.requests[chunk.request_id]
            request.num_computed_tokens = chunk.end
            request.num_registered_tokens = coordinator.register_attention(
                request.request_id,
                request.block_hashes,
                request.num_registered_tokens,
                chunk.end,
                request.targets,
            )
            reasons = request.targets
            interval = self._interval_positions.get(chunk.request_id)
            if interval:
                reasons = {**interval, **reasons}
            request.checkpoints.extend(
                coordinator.register_mamba(chunk.mamba_writes, request.block_hashes, reasons)
            )
            if chunk.sample:
                token = result.sampled[request.request_id]
                request.append_output(token)
                if request.first_token_ts is None:
                    request.first_token_ts = now
                if token in request.sampling.stop_token_ids:
                    self._retire(request, "stop", finished)
                elif len(request.output_token_ids) >= request.sampling.max_tokens:
                    self._retire(request, "length", finished)
            elif request.is_pin and chunk.end == request.num_tokens:
                self.running.remove(request)
                self._finish_pin(request)
        coordinator.end_step()
        self._emit_block_states()
        return finished

    def _retire(self, request: Request, reason: str, finished: list[Request]) -> None:
        self.running.remove(request)
        self._finish(request, reason)
        finished.append(request)

    def _finish(self, request: Request, reason: str) -> None:
        block_ids = self.coordinator.block_tables(request.request_id)  # before they are freed
        self.coordinator.free_request(request.request_id)
        self.requests.pop(request.request_id, None)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finished_ts = time.time()
        if request.is_pin:
            pin = self.pins.get(request.pin_id)
            if pin is not None and pin.state is PinState.PENDING:
                self._pin_failed(pin, f"materialization ended: {reason}")
            return
        if not self.is_recording:
            return
        self.sink.emit(
            RequestFinished(
                request_id=request.request_id,
                num_prompt_tokens=request.num_prompt_tokens,
                num_cached_tokens=request.num_cached_tokens or 0,
                hit_tokens_by_group=dict(request.hit_tokens_by_group),
                num_computed_tokens=request.num_prefill_computed,
                num_output_tokens=len(request.output_token_ids),
                chunks=list(request.chunks),
                chunk_stop_reasons=list(request.chunk_stop_reasons),
                checkpoints=list(request.checkpoints),
                num_preemptions=request.num_preemptions,
                finish_reason=reason,
                arrival_ts=request.arrival_ts,
                first_token_ts=request.first_token_ts,
                finished_ts=request.finished_ts,
                ttft_s=request.ttft_s,
                block_ids=block_ids,
                **self._match_record(request),
            )
        )

    def _match_record(self, request: Request) -> dict:
        """Where the request's attention match ended, and its tokens when no checkpoint was
        there: what the control plane ranks junctions by and what pinning one needs."""
        match = request.hit_tokens_by_group.get(ATTENTION, 0)
        if match < self.unit:
            return {"pin_hits": dict(request.pin_hits)}
        covered = (request.num_cached_tokens or 0) >= match
        return {
            "pin_hits": dict(request.pin_hits),
            "attention_match_key": request.block_hashes[match // self.unit - 1].hex(),
            "junction_token_ids": None if covered else request.prompt_token_ids[:match],
        }

    def _finish_pin(self, request: Request) -> None:
        pin = self.pins[request.pin_id]
        materialize(self.coordinator, pin, request.block_hashes, self.cache_config.pin_max_share)
        self._finish(request, "pinned")
        self._emit_pin(pin)

    def _pin_failed(self, pin: Pin, reason: str) -> None:
        pin.state, pin.reason = PinState.FAILED, reason
        self._emit_pin(pin)

    def _emit_pin(self, pin: Pin) -> None:
        self.sink.emit(pin.event())

    def _emit_block_states(self) -> None:
        if not self.is_recording:
            return
        for pool in self.coordinator.pools.values():
            dirty = pool.take_dirty()
            if dirty:
                self.sink.emit(
                    BlockStateChanged(
                        group_idx=pool.group_idx,
                        group=pool.group,
                        blocks=[pool.row(b) for b in dirty],
                        step=self.step_id,
                    )
                )

    def check_invariants(self) -> None:
        self.coordinator.check_invariants()
        for request in self.running:
            if request.num_computed_tokens > request.num_tokens:
                raise AssertionError(
                    f"request {request.request_id}: computed {request.num_computed_tokens} "
                    f"of {request.num_tokens} tokens"
                )
