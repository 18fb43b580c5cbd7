"""The control plane's Prometheus metrics, in a registry of the app's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.batches = Counter(
            "junction_ingest_batches",
            "Event batches committed (acknowledged duplicates not counted)",
            registry=self.registry,
        )
        self.duplicate_batches = Counter(
            "junction_ingest_duplicate_batches",
            "Batches acknowledged again and skipped",
            registry=self.registry,
        )
        self.events = Counter("junction_ingest_events", "Events committed", registry=self.registry)
        self.snapshots = Counter(
            "junction_ingest_snapshots", "Block-table snapshots applied", registry=self.registry
        )
        self.latency = Histogram(
            "junction_ingest_latency_seconds",
            "From a frame's arrival to its ack (decode, validate, commit)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.connected_engines = Gauge(
            "junction_connected_engines",
            "Engines with an open ingest socket",
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "junction_ingest_dead_letters",
            "Frames the store refused, parked as dead letters and acknowledged",
            registry=self.registry,
        )
        self.rejected_frames = Counter(
            "junction_ingest_rejected",
            "Connections closed for bad input, by close code",
            ["code"],
            registry=self.registry,
        )
        # the retention task (`api.retention`)
        self.retention_rows = Counter(
            "junction_retention_rows",
            "Rows the retention task deleted, by kind (event_batches, requests, attributions,"
            " buckets_expired; buckets_rolled_up: fine buckets merged into coarse ones)",
            ["kind"],
            registry=self.registry,
        )
        self.retention_rounds = Counter(
            "junction_retention_rounds",
            "Retention rounds, by outcome: pruned, skipped (another replica held the lock),"
            " failed (a database error; tried again next round)",
            ["outcome"],
            registry=self.registry,
        )
