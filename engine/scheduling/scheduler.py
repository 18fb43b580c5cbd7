"""The scheduler: waiting and running queues, a token budget, chunked prefill with boundary
stops, copy-on-write, preemption when blocks run out, and decode.

One step flows one way: `schedule()` (lookup, allocate, queue copies) -> the runner ->
`update()` (register entries, sample, finish) -> events.
"""

from __future__ import annotations

import time
from collections import deque

from engine.cache.coordinator import CacheHit, HybridCoordinator
from engine.cache.entry import CheckpointReason
from engine.cache.mamba import MambaHit
from engine.config import CacheConfig, SchedulerConfig
from engine.events import ATTENTION, MAMBA, EventSink
from engine.pins import Pin, PinManager
from engine.request import AdmissionMatch, Request, RequestStatus
from engine.scheduling.arrivals import Arrivals
from engine.scheduling.capacity import check_fits
from engine.scheduling.chunking import Chunk
from engine.scheduling.inflight import InflightSharing
from engine.scheduling.outputs import RunnerOutput, ScheduledChunk, SchedulerOutput
from engine.scheduling.planner import DECODE, ChunkPlanner
from engine.scheduling.records import request_finished
from engine.scheduling.step_events import StepEvents
from engine.tiers.moves import UnitLoad
from engine.tiers.shared import SHARED, SharedTier
from engine.tiers.stack import DISK, HOST, TierStack
from engine.tiers.tiering import TierCosts, Tiering, TierPlan


class Scheduler:
    def __init__(
        self,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        sink: EventSink,
        medium: str = "GPU",
        tiers: TierStack | None = None,
        costs: TierCosts | None = None,
        disk_by_policy: bool = False,
        shared: SharedTier | None = None,
    ) -> None:
        self.cache_config = cache_config
        self.config = scheduler_config
        self.sink = sink
        self.is_recording = sink.is_recording
        self.coordinator = HybridCoordinator(cache_config, sink, medium)
        # the tiers under the device pools, None without them (`engine.tiers.tiering`)
        self.tiering = (
            None
            if tiers is None
            else Tiering(tiers, self.coordinator, sink, costs, disk_by_policy, shared)
        )
        self.unit = cache_config.match_unit
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.arrivals = Arrivals()
        self.pin_manager = PinManager(self.coordinator, cache_config, sink)
        self.sharing = InflightSharing(self.coordinator, cache_config, scheduler_config)
        self.planner = ChunkPlanner(cache_config, scheduler_config, self.pin_manager)
        self.events = StepEvents(sink, self.coordinator.pools)
        self.step_id = 0
        self._refused: list[Request] = []  # finished while scheduling: update() returns them
        # this step's interval states per request (position -> reason), registered by update()
        self._interval_positions: dict[str, dict[int, CheckpointReason]] = {}

    # ------------------------------------------------------------------ intake
    @property
    def requests(self) -> dict[str, Request]:
        """The requests in the engine by id, in arrival order: the oldest first."""
        return self.arrivals.requests

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        if request.num_prompt_tokens == 0:
            raise ValueError(f"request {request.request_id!r} has an empty prompt")
        if not request.is_pin and request.sampling.max_tokens < 1:
            raise ValueError(f"request {request.request_id!r}: max_tokens must be >= 1")
        check_fits(
            request,
            self.cache_config,
            self.config.max_model_len,
            self.coordinator.pools,
            self.pin_manager.num_pins,
        )
        request.arrival_step = self.step_id
        self.arrivals.add(request)
        self.waiting.append(request)

    def oldest_unfinished_index(self) -> int:
        """The arrival index of the oldest request still in the engine (the next index when
        none is): every request that arrived before it has finished."""
        return self.arrivals.oldest_unfinished_index()

    def abort_request(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
        self._finish(request, "abort")
        self.events.block_states(self.step_id)
        return request

    # ------------------------------------------------------------------ pins
    @property
    def pins(self) -> dict[str, Pin]:
        return self.pin_manager.pins

    def add_pin(self, pin_id: str, token_ids: list[int], cache_salt: str | None = None) -> Pin:
        """Queue a pin's materialization: a prefill of its prefix up to the boundary."""
        pin, request = self.pin_manager.add(pin_id, token_ids, cache_salt)
        if request is not None:
            self.add_request(request)
            pin.arrival_index = request.arrival_index
            pin.arrival_step = request.arrival_step
            self.pin_manager.emit(pin)
        return pin

    def remove_pin(self, pin_id: str) -> Pin:
        pin = self.pin_manager.find(pin_id)
        self.abort_request(pin.request_id)
        self.pin_manager.release(pin)
        self.events.block_states(self.step_id)
        return pin

    # ------------------------------------------------------------------ schedule
    def has_unfinished(self) -> bool:
        """Requests to run, or units to publish to the shared tier (a step copies them out,
        even when no request is left to run)."""
        tiering = self.tiering
        return bool(self.waiting or self.running or (tiering is not None and tiering.publishing))

    def schedule(self) -> SchedulerOutput:
        self.step_id += 1
        coordinator = self.coordinator
        coordinator.begin_step(self.step_id)
        out = SchedulerOutput(self.step_id, new_block_ids={ATTENTION: [], MAMBA: []})
        budget = self.config.max_num_batched_tokens
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            chunk = self.planner.plan(request, request.num_computed_tokens, budget)
            if chunk is None:
                index += 1
                continue
            positions = self.planner.positions(request, request.num_computed_tokens, chunk.end)
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
        if self.tiering is not None:
            out.saves = self.tiering.take_saves()
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
            hashes = self.requests[chunk.request_id].block_hashes
            new_ids = coordinator.add_interval_states(chunk.start, chunk.end, writes, hashes)
            if not new_ids:
                continue
            out.new_block_ids[MAMBA].extend(new_ids)
            added = set(new_ids)
            self._interval_positions[chunk.request_id] = {
                position: CheckpointReason.INTERVAL
                for position, block_id in writes
                if block_id in added
            }

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
                request.num_copy_wait_steps += 1
                break  # its checkpoint is being copied this step: it hits next step
            if request.is_pin and hit.length >= request.num_tokens:
                del self.waiting[index]
                self._finish_pin(request)
                continue
            if self.tiering is not None and not request.is_pin:
                plan = self.tiering.find(request.block_hashes, request.num_tokens, hit.length)
                if plan is not None:
                    if self.sharing.waits_for_producer(request, plan.as_hit(hit), self.running):
                        index += 1
                        continue
                    loaded = self._admit_loading(out, request, hit, plan)
                    if loaded is None:
                        break  # no room for its blocks yet
                    if loaded:
                        del self.waiting[index]
                        continue
            if self.sharing.waits_for_producer(request, hit, self.running):
                index += 1  # the requests behind it may go ahead
                continue
            if not request.is_observed:  # the policies learn from its chain before admitting
                request.branch_point = coordinator.observe(request.block_hashes)
                request.is_observed = True
            junction = branch = None
            if config.junction_checkpoints:
                if hit.attention_length > hit.length:
                    junction = hit.attention_length
                else:  # the match finds none: where prompts parted, as the policy learnt it
                    branch = request.branch_point
            targets = self.planner.targets(request, junction, branch)
            self.sharing.keep_sibling_junctions(request, hit, targets, self.waiting)
            refused = coordinator.refused_states(
                request.block_hashes, request.num_prompt_tokens, hit.length, targets
            )
            request.refused_states = refused
            request.targets = {p: r for p, r in targets.items() if p not in refused}
            request.prefill_target = request.num_tokens
            chunk = self.planner.plan(request, hit.length, budget)
            if chunk is None:
                break
            positions = self.planner.positions(request, hit.length, chunk.end)
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
            if refused:
                coordinator.tell_refused(request.block_hashes, refused, targets)
            self.running.append(request)
            budget -= self._schedule_chunk(out, request, chunk, positions)

    def _admit_loading(
        self, out: SchedulerOutput, request: Request, device: CacheHit, plan: TierPlan
    ) -> bool | None:
        """Admit a request whose hit the tiers extend: over the device's attention to
        `plan.start`, with blocks for the rest of the hit that the runner loads this step, in
        which it computes nothing (it is loading). True when admitted, None when its blocks do
        not fit yet, False when a unit turned out corrupt (it is admitted as usual instead)."""
        coordinator, tiering = self.coordinator, self.tiering
        assert tiering is not None
        request_id = request.request_id
        hit = CacheHit(plan.start, plan.start, plan.attention_block_ids, MambaHit(0, None, False))
        need = coordinator.count_admission(request_id, hit, plan.length, [])
        need[MAMBA] += 1
        if not coordinator.can_allocate(need):
            return None
        read = tiering.read(plan, request_id, device.length)
        if read is None:
            return False
        units, places = read
        if not request.is_observed:
            request.branch_point = coordinator.observe(request.block_hashes)
            request.is_observed = True
        junction = branch = None
        if self.cache_config.junction_checkpoints:
            if device.attention_length > plan.length:  # the device's attention goes on
                junction = device.attention_length
            else:
                branch = request.branch_point
        targets = self.planner.targets(request, junction, branch)
        self.sharing.keep_sibling_junctions(request, plan.as_hit(device), targets, self.waiting)
        refused = coordinator.refused_states(
            request.block_hashes, request.num_prompt_tokens, plan.length, targets
        )
        request.refused_states = refused
        request.targets = {p: r for p, r in targets.items() if p not in refused}
        request.prefill_target = request.num_tokens
        self.events.queue_copies(out, request, coordinator.admit(request_id, hit))
        out.new_block_ids[ATTENTION].extend(
            coordinator.attention.allocate_chunk(request_id, plan.length)
        )
        state_block = coordinator.mamba.allocate_state(request_id, plan.length)
        out.new_block_ids[MAMBA].append(state_block)
        if refused:
            coordinator.tell_refused(request.block_hashes, refused, targets)
        table = coordinator.attention.tables[request_id]
        out.loads.append(
            UnitLoad(
                request_id,
                plan.start,
                plan.length,
                tuple(table),
                state_block,
                tuple(units),
                tuple(places),
            )
        )
        tiering.num_loaded_tokens += plan.length - device.length
        if request.num_cached_tokens is None:
            request.num_cached_tokens = plan.length
            request.hit_tokens_by_group = {ATTENTION: plan.length, MAMBA: plan.length}
            farthest = max(places, key=(HOST, DISK, SHARED).index)  # the load counts whole there
            request.hit_tokens_by_medium = {farthest: plan.length - device.length}
            request.pin_hits = self.pin_manager.hits(request, plan.length)
            seen = plan.as_hit(device)
            request.match = AdmissionMatch(
                seen.proof_length,
                seen.proof_limit,
                self.sharing.in_flight_reach(request, self.running),
            )
        request.num_loaded_tokens += plan.length - device.length
        request.num_computed_tokens = plan.start
        request.num_registered_tokens = plan.start
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        return True

    def _loaded(self, load: UnitLoad) -> None:
        """The runner wrote a load: the request has computed to its end, whose keys and
        state the device now holds (registered as any computed ones)."""
        coordinator = self.coordinator
        request = self.requests[load.request_id]
        hashes = request.block_hashes
        request.num_computed_tokens = load.end
        request.num_registered_tokens = coordinator.register_attention(
            request.request_id, hashes, load.start, load.end, request.targets
        )
        reason = request.targets.get(load.end, CheckpointReason.BLOCK)
        positions = coordinator.register_mamba(
            [(load.end, load.state_block)], hashes, {load.end: reason}
        )
        request.checkpoints.extend(positions)
        assert self.tiering is not None
        self.tiering.registered(hashes, positions)

    def _admit(self, out: SchedulerOutput, request: Request, hit: CacheHit) -> None:
        copies = self.coordinator.admit(request.request_id, hit)
        self.events.queue_copies(out, request, copies)
        if request.num_cached_tokens is None:
            request.num_cached_tokens = hit.length
            request.hit_tokens_by_group = hit.by_group
            request.pin_hits = self.pin_manager.hits(request, hit.length)
            request.match = AdmissionMatch(
                hit.proof_length,
                hit.proof_limit,
                self.sharing.in_flight_reach(request, self.running),
            )
        request.num_computed_tokens = hit.length
        request.num_registered_tokens = hit.length
        request.status = RequestStatus.RUNNING

    def _schedule_chunk(
        self, out: SchedulerOutput, request: Request, chunk: Chunk, positions: list[int]
    ) -> int:
        start, end = request.num_computed_tokens, chunk.end
        work = self.coordinator.allocate_chunk(request.request_id, start, end, positions)
        self.events.queue_copies(out, request, work.copies)
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
        state_size = self.cache_config.mamba_block_size
        tiering = self.tiering
        if tiering is not None:
            tiering.stored(result.saved)
            for load in out.loads:
                self._loaded(load)
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
            registered = coordinator.register_mamba(
                chunk.mamba_writes, request.block_hashes, reasons, request.refused_states
            )
            request.checkpoints.extend(registered)
            if tiering is not None and registered:
                tiering.registered(request.block_hashes, registered)
            if (chunk.end - 1) // state_size > (max(chunk.start, 1) - 1) // state_size:
                # it crossed a Mamba slot's end: the slot it passed may go back to the pool
                coordinator.release_passed(request.request_id, chunk.start, chunk.end)
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
        self.events.block_states(self.step_id)
        return finished

    def _retire(self, request: Request, reason: str, finished: list[Request]) -> None:
        self.running.remove(request)
        self._finish(request, reason)
        finished.append(request)

    def _finish(self, request: Request, reason: str) -> None:
        block_ids = self.coordinator.block_tables(request.request_id)  # before they are freed
        self.coordinator.free_request(request.request_id)
        self.arrivals.remove(request.request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finished_ts = time.time()
        if request.is_pin:
            self.pin_manager.prefill_ended(request, reason)
            return
        if self.is_recording:
            oldest = self.oldest_unfinished_index()
            self.sink.emit(request_finished(request, block_ids, self.unit, oldest))

    def _finish_pin(self, request: Request) -> None:
        pin = self.pin_manager.materialize(request)
        self._finish(request, "pinned")
        self.pin_manager.emit(pin)

    def check_invariants(self) -> None:
        self.coordinator.check_invariants()
        if self.tiering is not None:
            self.tiering.check_invariants()
        self.pin_manager.check_invariants()
        for request in self.running:
            if request.num_computed_tokens > request.num_tokens:
                raise AssertionError(
                    f"request {request.request_id}: computed {request.num_computed_tokens} "
                    f"of {request.num_tokens} tokens"
                )
