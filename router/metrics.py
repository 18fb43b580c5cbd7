"""The router's Prometheus metrics, in a registry of its own per app: its decisions, the hit it
predicted against the hit each engine reported, how long routing took, and each engine's
state and index size (read at each scrape)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as render_text
from prometheus_client.core import GaugeMetricFamily

from engine.events import GROUPS
from router.fleet import Decision, Fleet

ROUTE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1)


class RouterMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, fleet: Fleet) -> None:
        self.registry = r = CollectorRegistry()
        r.register(_FleetCollector(fleet))
        self.decisions = Counter(
            "junction_router_decisions",
            "Requests routed, by engine and why it was chosen",
            ["engine", "reason"],
            registry=r,
        )
        self.predicted = Counter(
            "junction_router_predicted_hit_tokens",
            "Hit tokens the router predicted for the requests it routed",
            ["engine"],
            registry=r,
        )
        self.realised = Counter(
            "junction_router_realised_hit_tokens",
            "Hit tokens the engines reported (cached_tokens) for those requests",
            ["engine"],
            registry=r,
        )
        self.outcomes = Counter(
            "junction_router_predictions",
            "Finished requests whose realised hit equalled the prediction, or not",
            ["outcome"],
            registry=r,
        )
        self.failovers = Counter(
            "junction_router_failovers",
            "Requests sent elsewhere because the chosen engine refused the connection",
            ["engine"],
            registry=r,
        )
        self.failures = Counter(
            "junction_router_failures",
            "Requests that failed on an engine after they were sent (never retried)",
            ["engine"],
            registry=r,
        )
        self.route_seconds = Histogram(
            "junction_router_route_seconds",
            "Time to hash, score and choose an engine for one request",
            buckets=ROUTE_BUCKETS,
            registry=r,
        )

    def routed(self, decision: Decision) -> None:
        self.decisions.labels(decision.url, decision.reason).inc()
        self.route_seconds.observe(decision.route_s)

    def finished(self, decision: Decision) -> None:
        self.predicted.labels(decision.url).inc(decision.predicted_hit)
        if decision.realised_hit is not None:
            self.realised.labels(decision.url).inc(decision.realised_hit)
            same = decision.realised_hit == decision.predicted_hit
            self.outcomes.labels("equal" if same else "differ").inc()

    def render(self) -> bytes:
        return render_text(self.registry)


class _FleetCollector:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self):
        up = GaugeMetricFamily(
            "junction_router_engine_up",
            "1 while the engine's cache feed is live",
            labels=["engine"],
        )
        keys = GaugeMetricFamily(
            "junction_router_index_keys",
            "Keys the router's index holds for an engine's group",
            labels=["engine", "group"],
        )
        in_flight = GaugeMetricFamily(
            "junction_router_in_flight",
            "Requests routed to an engine and not yet finished",
            labels=["engine"],
        )
        for engine in self.fleet.engines.values():
            up.add_metric([engine.url], 1.0 if engine.is_up else 0.0)
            in_flight.add_metric([engine.url], len(engine.in_flight))
            if engine.index is not None:
                for group, count in zip(GROUPS, engine.index.num_keys, strict=True):
                    keys.add_metric([engine.url, group], count)
        yield from (up, keys, in_flight)
