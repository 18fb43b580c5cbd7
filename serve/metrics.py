"""The engine server's Prometheus metrics, in a registry of its own per app.

Request counters and histograms are fed by the `AsyncEngine`'s finish records (so requests a
client abandoned count too); the cache gauges are read from `Engine.cache_usage()` at each
scrape, and so are the event publisher's counts (`PublisherCollector`), when the engine streams
to a control plane. A prompt counts as queried in a group once the engine has looked it up,
and its hits are the tokens that group served from the cache (`attention`: its match;
`mamba`: the hit length).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from engine.events import GROUPS
from engine.stats import CacheUsage
from engine.tiers.counters import READ_SECONDS_BUCKETS, ReadTimes, TierStats
from engine.tiers.tiering import TieringStats
from engine.wire import BLOCK_STATES
from publish.publisher import PublisherStats
from serve.request_stream import FinishedRequest

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        num_in_flight: Callable[[], int] | None = None,
        publisher_stats: Callable[[], PublisherStats] | None = None,
    ) -> None:
        self.registry = r = CollectorRegistry()
        if publisher_stats is not None:
            r.register(PublisherCollector(publisher_stats))
        self.tiers: TieringStats | None = None  # read from the engine at each scrape
        r.register(TierCollector(lambda: self.tiers))
        self.queries = Counter(
            "junction_prefix_cache_queries_tokens",
            "Prompt tokens looked up in the prefix cache",
            ["group"],
            registry=r,
        )
        self.hits = Counter(
            "junction_prefix_cache_hits_tokens",
            "Prompt tokens served from the prefix cache",
            ["group"],
            registry=r,
        )
        self.usage = Gauge(
            "junction_cache_usage_ratio",
            "Share of a group's blocks a new request could not take without evicting",
            ["group"],
            registry=r,
        )
        self.blocks = Gauge(
            "junction_cache_blocks",
            "Blocks of a group by state (cached: free but still holding entries)",
            ["group", "state"],
            registry=r,
        )
        self.ttft = Histogram(
            "junction_request_ttft_seconds",
            "Time from submission to the first generated token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "junction_request_e2e_seconds",
            "Time from submission to the end of the request",
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.requests = Counter("junction_requests", "Requests the engine accepted", registry=r)
        self.finished = Counter(
            "junction_requests_finished", "Requests finished, by reason", ["reason"], registry=r
        )
        self.prompt_tokens = Counter(
            "junction_prompt_tokens", "Prompt tokens of finished requests", registry=r
        )
        self.generation_tokens = Counter(
            "junction_generation_tokens", "Tokens generated", registry=r
        )
        self.in_flight = Gauge(
            "junction_requests_in_flight", "Requests in the engine now", registry=r
        )
        if num_in_flight is not None:
            self.in_flight.set_function(num_in_flight)
        for group in GROUPS:  # every series exists from the start, at zero
            self.queries.labels(group)
            self.hits.labels(group)

    def observe_finished(self, record: FinishedRequest) -> None:
        """Thread-safe: the `AsyncEngine` calls it on the engine thread."""
        self.finished.labels(record.finish_reason).inc()
        self.prompt_tokens.inc(record.num_prompt_tokens)
        self.generation_tokens.inc(record.num_output_tokens)
        if record.num_cached_tokens is not None:
            for group, hit in record.hit_tokens_by_group.items():
                self.queries.labels(group).inc(record.num_prompt_tokens)
                self.hits.labels(group).inc(hit)
        if record.ttft_s is not None:
            self.ttft.observe(record.ttft_s)
        if record.e2e_s is not None:
            self.e2e.observe(record.e2e_s)

    def observe_cache_usage(self, usage: dict[str, CacheUsage]) -> None:
        for group, u in usage.items():
            self.usage.labels(group).set(u.usage)
            counts = (u.num_free, u.num_cached, u.num_in_use, u.num_pinned)
            for state, count in zip(BLOCK_STATES, counts, strict=True):
                self.blocks.labels(group, state).set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class TierCollector:
    """The tiers below the device at each scrape (docs/rules.md section 16): each tier's bytes,
    capacity and units, and what has moved; nothing without tiers."""

    def __init__(self, stats: Callable[[], TieringStats | None]) -> None:
        self.stats = stats

    def collect(self):
        s = self.stats()
        if s is None:
            return
        tiers = [("host", s.stack.host)] + ([("disk", s.stack.disk)] if s.stack.disk else [])
        if s.shared is not None:  # as of this engine's last put: other engines add to it
            tiers.append(("shared", s.shared.tier))
        for name, help_text, read in (
            ("junction_tier_bytes", "Bytes a tier holds now", lambda t: t.num_bytes),
            (
                "junction_tier_capacity_bytes",
                "The most a tier may hold",
                lambda t: t.capacity_bytes,
            ),
            ("junction_tier_units", "Usable-hit units a tier holds now", lambda t: t.num_units),
        ):
            family = GaugeMetricFamily(name, help_text, labels=["tier"])
            for tier, stats in tiers:
                family.add_metric([tier], read(stats))
            yield family
        corrupt = CounterMetricFamily(
            "junction_tier_corrupt_units", "Unit files dropped as corrupt", labels=["tier"]
        )
        hits = CounterMetricFamily(
            "junction_tier_unit_hits", "Units read back from a tier for a load", labels=["tier"]
        )
        for tier, stats in tiers:
            corrupt.add_metric([tier], stats.num_corrupt)
            hits.add_metric([tier], stats.num_hits)
        yield corrupt
        yield hits
        if s.shared is not None:
            yield from shared_metrics(s)
        counters = (
            ("junction_tier_saves", "States the device gave up that went down a tier", s.num_saves),
            ("junction_tier_loads", "Requests whose hit was read from a tier", s.num_loads),
            (
                "junction_tier_loaded_tokens",
                "Hit tokens the tiers served beyond the device's own",
                s.num_loaded_tokens,
            ),
            (
                "junction_tier_loaded_bytes",
                "Bytes read from the tiers for hits",
                s.num_loaded_bytes,
            ),
            (
                "junction_tier_loads_refused_slow",
                "Tier hits not taken: loading would take longer than prefilling",
                s.num_refused_slow,
            ),
        )
        for name, help_text, value in counters:
            yield CounterMetricFamily(name, help_text, value=value)
        yield from offload_families(s, tiers)


def offload_families(s: TieringStats, tiers: list[tuple[str, TierStats]]):
    """The tiers per tier, named as vLLM names its KV offloading's (`vllm:kv_offload_*`, its
    tiering's `..._tiering_block_hits`, `..._read_bytes`, `..._read_time` by `tier`) with
    Junction's prefix: usage, unit hits, hit tokens, bytes read and read seconds."""
    usage = GaugeMetricFamily(
        "junction:kv_offload_cache_usage_perc", "Share of a tier's bytes in use", labels=["tier"]
    )
    for tier, t in tiers:
        usage.add_metric([tier], t.num_bytes / t.capacity_bytes if t.capacity_bytes else 0.0)
    yield usage
    tokens = s.loaded_tokens_by_medium
    for name, help_text, read in (
        ("block_hits", "Units read from a tier for hits", lambda t, _: t.num_hits),
        ("hit_tokens", "Hit tokens a tier served", lambda _, tier: tokens.get(tier, 0)),
        ("read_bytes", "Bytes read from a tier for hits", lambda t, _: t.bytes_out),
    ):
        family = CounterMetricFamily(
            f"junction:kv_offload_tiering_{name}", help_text, labels=["tier"]
        )
        for tier, stats in tiers:
            family.add_metric([tier], read(stats, tier))
        yield family
    seconds = HistogramMetricFamily(
        "junction:kv_offload_tiering_read_time_seconds",
        "Seconds reading one unit out of a tier for a hit",
        labels=["tier"],
    )
    for tier, _ in tiers:
        times = s.read_times.get(tier, ReadTimes.empty())
        cumulative, buckets = 0, []
        for bound, count in zip((*READ_SECONDS_BUCKETS, float("inf")), times.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
        seconds.add_metric([tier], buckets, times.total_s)
    yield seconds


def shared_metrics(s: TieringStats):
    """The shared tier's own: its loads, whether its store answers, what it refused."""
    assert s.shared is not None
    counters = (
        (
            "junction_tier_shared_loads",
            "Requests whose hit read a unit from the shared tier",
            s.num_shared_loads,
        ),
        (
            "junction_tier_shared_loaded_tokens",
            "Hit tokens read from the shared tier",
            s.num_shared_loaded_tokens,
        ),
        (
            "junction_tier_shared_published",
            "Units sent to the shared tier while their state was on the device",
            s.num_published,
        ),
        ("junction_shared_store_errors", "Shared store calls that failed", s.shared.num_errors),
        (
            "junction_shared_store_foreign_units",
            "Shared entries dropped as written for another model or geometry",
            s.shared.num_foreign,
        ),
    )
    for name, help_text, value in counters:
        yield CounterMetricFamily(name, help_text, value=value)
    yield GaugeMetricFamily(
        "junction_shared_store_up",
        "1 while the shared store answers, 0 since a call to it failed",
        value=int(s.shared.is_up),
    )


class PublisherCollector:
    """The event publisher's counts at each scrape: what it holds for the control plane while
    it is away, and what it had to give up (batches for a snapshot; finished requests only past
    the outbox's stated limits, which `junction_publisher_requests_dropped` counts)."""

    def __init__(self, stats: Callable[[], PublisherStats]) -> None:
        self.stats = stats

    def collect(self):
        s = self.stats()
        counters = (
            ("junction_publisher_frames_sent", "Event frames sent, resends included", s.num_sent),
            (
                "junction_publisher_batches_dropped",
                "Batches given up for a snapshot",
                s.num_dropped,
            ),
            ("junction_publisher_snapshots", "Snapshot frames sent", s.num_snapshots),
            (
                "junction_publisher_requests_dropped",
                "Finished requests given up before the control plane stored them",
                s.num_requests_dropped,
            ),
        )
        for name, help_text, value in counters:
            yield CounterMetricFamily(name, help_text, value=value)
        gauges = (
            ("junction_publisher_buffered_frames", "Frames not yet acknowledged", s.num_buffered),
            (
                "junction_publisher_buffered_bytes",
                "Encoded bytes held for the control plane",
                s.num_buffered_bytes,
            ),
            (
                "junction_publisher_requests_waiting",
                "Finished requests not yet acknowledged by the control plane",
                s.num_requests_waiting,
            ),
            ("junction_publisher_connected", "1 while connected", int(s.is_connected)),
        )
        for name, help_text, value in gauges:
            yield GaugeMetricFamily(name, help_text, value=value)
