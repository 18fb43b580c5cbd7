"""`Engine`: a scheduler and a runner stepping together, with the events they emit."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

import msgspec

from engine.config import CacheConfig, ModelConfig, SchedulerConfig, TierConfig
from engine.events import EventSink, ListSink
from engine.geometry import CacheGeometry
from engine.hashing import hash_prefix
from engine.pins import Pin, PinLeases, lease_id
from engine.request import Request, SamplingParams
from engine.runners import make_runner
from engine.runners.base import Runner
from engine.scheduling.outputs import RunnerOutput, SchedulerOutput
from engine.scheduling.scheduler import Scheduler
from engine.snapshot import block_table_snapshot, cache_geometry
from engine.stats import CacheUsage, EngineStats, cache_usage
from engine.tiers.fingerprint import fingerprint_hash
from engine.tiers.setup import (
    build_stack,
    fingerprint,
    measure_disk_bandwidth,
    measure_host_bandwidth,
    tier_costs,
)
from engine.tiers.shared import SharedStore, SharedTier
from engine.tiers.stack import TierStack
from engine.tiers.tiering import TierCosts, TieringStats


class Engine:
    def __init__(
        self,
        cache_config: CacheConfig | None = None,
        scheduler_config: SchedulerConfig | None = None,
        model_config: ModelConfig | None = None,
        runner: str | Runner = "null",
        sink: EventSink | None = None,
        engine_id: str = "engine-0",
        tiers: TierConfig | None = None,
        shared: Callable[[str], SharedStore] | None = None,
        tier_stack: TierStack | None = None,
    ) -> None:
        """`shared` opens, in the namespace it is given (the fingerprint of the model and
        geometry), a store that engines of them share: the tier below host memory and disk
        (`engine.tiers.shared`; its backends: `sharedstore.open_store`). `tier_stack`, when
        given, is the tiers in place of those `tiers` asks for (a what-if's model of a disk
        tier, `whatif.tiers`)."""
        self.cache_config = cache_config or CacheConfig()
        self.scheduler_config = scheduler_config or SchedulerConfig()
        self.model_config = model_config or ModelConfig()
        self.engine_id = engine_id
        self.sink: EventSink = sink if sink is not None else ListSink()
        runner_name = runner if isinstance(runner, str) else runner.kind or type(runner).__name__
        if isinstance(runner, str):
            runner = make_runner(runner, self.cache_config, self.model_config)
        self.runner = runner
        self.tier_config = tiers or TierConfig()
        geometry = fingerprint(self.cache_config, self.model_config, runner_name)
        if tier_stack is None:
            tier_stack = build_stack(self.tier_config, geometry, with_shared=shared is not None)
        stack = tier_stack
        namespace = fingerprint_hash(geometry)
        shared_tier = None if shared is None else SharedTier(shared(namespace), namespace)
        self.scheduler = Scheduler(
            self.cache_config,
            self.scheduler_config,
            self.sink,
            medium=runner.medium,
            tiers=stack,
            costs=tier_costs(self.tier_config),
            disk_by_policy=self.tier_config.disk_admission == "policy",
            shared=shared_tier,
        )
        self._ids = itertools.count()
        self.num_steps = 0
        self.last_output: SchedulerOutput | None = None
        self.last_result: RunnerOutput | None = None
        self.stats = EngineStats()
        self.epoch = time.time_ns()  # an engine start is a new epoch of its event stream
        self.step_listeners: list[Callable[[Engine], None]] = []
        self.leases = PinLeases()  # pins held for a TTL (`lease_pin`)
        self.clock: Callable[[], float] = time.monotonic  # the leases' (a test moves it)

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        checkpoint_offsets: Sequence[int] = (),
    ) -> Request:
        """Queue a request; `checkpoint_offsets` are where its rendered chat messages end (each
        in `(0, len(prompt)]`, else `ValueError`): the states there are kept (reason `message`)."""
        request = Request(
            request_id if request_id is not None else f"req-{next(self._ids)}",
            list(prompt_token_ids),
            sampling or SamplingParams(),
            self.cache_config.match_unit,
            cache_salt,
            checkpoint_offsets=tuple(checkpoint_offsets),
        )
        self.scheduler.add_request(request)
        return request

    def abort(self, request_id: str) -> Request | None:
        request = self.scheduler.abort_request(request_id)
        self.notify_listeners()
        return request

    def pin(self, pin_id: str, token_ids: Sequence[int], cache_salt: str | None = None) -> Pin:
        pin = self.scheduler.add_pin(pin_id, list(token_ids), cache_salt)
        self.notify_listeners()
        return pin

    def lease_pin(
        self, token_ids: Sequence[int], ttl_s: float, cache_salt: str | None = None
    ) -> Pin | None:
        """Pin the prefix of `token_ids` on the hit grid for `ttl_s` seconds (a client's cache
        breakpoint), renewing the lease if that prefix is leased already; its blocks count
        against `pin_max_share` like any pin's. None when `MAX_LEASES` other prefixes are held;
        `ValueError` when the prefix floors to nothing."""
        alignment = self.cache_config.hit_alignment
        boundary = len(token_ids) // alignment * alignment
        if boundary == 0:
            raise ValueError(f"{len(token_ids)} tokens floor to 0 on the {alignment}-token grid")
        prefix = list(token_ids[:boundary])
        pin_id = lease_id(hash_prefix(prefix, self.cache_config.match_unit, cache_salt)[-1])
        if not self.leases.has_room(pin_id):
            return None
        pin = self.pins.get(pin_id)
        if pin is None or not pin.is_active:
            pin = self.pin(pin_id, prefix, cache_salt)
        self.leases.lease(pin_id, ttl_s, self.clock())
        return pin

    def _end_leases(self) -> None:
        """Release the pins whose lease ended; they leave the list (a released event said so)."""
        for pin_id in self.leases.ended(self.clock()):
            if pin_id in self.pins and self.pins[pin_id].is_active:
                self.scheduler.remove_pin(pin_id)
            self.pins.pop(pin_id, None)

    def unpin(self, pin_id: str) -> Pin:
        pin = self.scheduler.remove_pin(pin_id)
        self.notify_listeners()
        return pin

    def notify_listeners(self) -> None:
        """Hand what changed to the step listeners (the publisher batches the sink's events)."""
        for listener in self.step_listeners:
            listener(self)

    @property
    def pins(self) -> dict[str, Pin]:
        return self.scheduler.pins

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[Request]:
        """Run one step; returns the requests that finished in it."""
        if self.leases.ends_at:
            self._end_leases()
        out = self.scheduler.schedule()
        result = self.runner.execute(out)
        finished = self.scheduler.update(out, result)
        self.num_steps += 1
        self.stats.num_steps += 1
        self.last_output = out
        self.last_result = result
        for request in finished:
            self.stats.record(request)
            if request.pin_hits and self.leases.ends_at:
                self.leases.renew(request.pin_hits, self.clock())
        self.notify_listeners()
        return finished

    def run_until_done(self, max_steps: int | None = None) -> list[Request]:
        finished: list[Request] = []
        for _ in itertools.count() if max_steps is None else range(max_steps):
            if not self.has_unfinished():
                break
            finished.extend(self.step())
        return finished

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams | None = None
    ) -> list[Request]:
        """Run `prompts` to completion; returns their requests in the order given."""
        requests = [self.add_request(p, sampling) for p in prompts]
        self.run_until_done()
        return requests

    def close(self) -> int:
        """A clean stop, between steps: every state the device holds goes down to the tiers,
        and every unit in host memory to disk, so that an engine restarted on the same
        `--disk-cache-dir` hits what this one held. Returns the units written to disk; 0
        without a disk tier. The engine may go on stepping after it."""
        tiering = self.scheduler.tiering
        if tiering is None or (tiering.stack.disk is None and tiering.shared is None):
            return 0
        saves = tiering.save_device()
        tiering.stored([self.runner.save_unit(save) for save in saves])
        return tiering.stack.flush()

    def tier_stats(self) -> TieringStats | None:
        """What the tiers below the device hold and have moved; None without tiers."""
        tiering = self.scheduler.tiering
        return None if tiering is None else tiering.stats()

    def price_tier_loads(self) -> TierCosts | None:
        """Measure what a tier load costs against the prefill it saves (the tiers' read
        bandwidths, the runner's prefill rate) and have the scheduler refuse loads slower than
        prefilling; before any request. None (every load taken) without tiers or a runner that
        computes. The tier config's rates, where given, are used as they are."""
        tiering = self.scheduler.tiering
        if tiering is None:
            return None
        config = self.tier_config
        prefill = config.prefill_tokens_per_s or self.runner.measure_prefill_rate()
        if prefill is None:
            return None
        device = "cuda" if self.runner.medium == "GPU" else "cpu"
        host = config.host_bytes_per_s or measure_host_bandwidth(device)
        disk = config.disk_bytes_per_s
        if disk is None:
            directory = config.disk_cache_dir
            disk = measure_disk_bandwidth(directory) if directory is not None else host
        tiering.costs = TierCosts(host, disk, prefill)
        return tiering.costs

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()

    def cache_usage(self) -> dict[str, CacheUsage]:
        return {name: cache_usage(pool) for name, pool in self.scheduler.coordinator.pools.items()}

    def cache_geometry(self) -> CacheGeometry:
        """What the engine's hello says of its cache."""
        pools = self.scheduler.coordinator.pools
        geometry = cache_geometry(self.cache_config, self.scheduler_config, pools)
        tiering = self.scheduler.tiering
        if tiering is None:
            return geometry
        stack = tiering.stack
        tiers = {"host": stack.host.index.capacity_bytes}
        if stack.disk is not None:
            tiers["disk"] = stack.disk.index.capacity_bytes
        return msgspec.structs.replace(geometry, tier_bytes=tiers)

    def snapshot(self) -> dict:
        """The block table as JSON (`engine.snapshot`)."""
        pools = self.scheduler.coordinator.pools
        return block_table_snapshot(
            self.engine_id, self.scheduler.step_id, self.cache_geometry(), pools
        )
