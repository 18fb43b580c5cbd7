"""The bridge's own Prometheus metrics, on a registry of its own (`BridgeStats.registry`),
which `junction attach --metrics-port` serves. Counters are per batch, never per event, so
they stay off the decode's hot path."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

#: `junction_bridge_bad_frames_total{reason}`'s reasons
BAD_REASONS = (
    "parts",  # a message not of three frames
    "seq",  # a seq frame not of 8 bytes
    "payload",  # a payload that is no KV event batch
    "event",  # an event of an unknown tag or shape (the rest of its batch is kept)
    "unstorable",  # an event the store could not hold (a hash too long, ...)
    "seq_backwards",  # a seq below the last one seen, not a duplicate of a replayed batch
    "replay",  # a replay answer the bridge could not read
    "too_large",  # a stored event larger than a frame or the outbox: sent without token ids
)


class BridgeStats:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._add_peer_metrics(self.registry)
        self._add_store_metrics(self.registry)
        self._add_feed_metrics(self.registry)
        for reason in BAD_REASONS:
            self.bad_frames.labels(reason)

    def _add_peer_metrics(self, r: CollectorRegistry) -> None:
        """The peer's event stream, per rank: batches, losses, bad input, scrapes."""
        self.batches = Counter(
            "junction_bridge_batches", "peer batches applied", ["rank"], registry=r
        )
        self.events = Counter(
            "junction_bridge_events", "peer events decoded and translated", ["rank"], registry=r
        )
        self.replayed = Counter(
            "junction_bridge_replayed_batches",
            "batches applied from the replay socket",
            ["rank"],
            registry=r,
        )
        self.duplicates = Counter(
            "junction_bridge_duplicates",
            "batches seen again (the live socket after a replay) and skipped",
            ["rank"],
            registry=r,
        )
        self.gaps = Counter(
            "junction_bridge_gaps", "seq gaps seen on the live socket", ["rank"], registry=r
        )
        self.resyncs = Counter(
            "junction_bridge_resyncs",
            "losses the replay could not fill (PeerResync sent)",
            ["rank", "reason"],
            registry=r,
        )
        self.restarts = Counter(
            "junction_bridge_restarts", "publisher restarts seen", ["rank"], registry=r
        )
        self.bad_frames = Counter(
            "junction_bridge_bad_frames", "bad input, by reason", ["reason"], registry=r
        )
        self.next_seq = Gauge(
            "junction_bridge_next_seq", "the seq wanted next, per rank", ["rank"], registry=r
        )
        self.live_connections = Counter(
            "junction_bridge_live_connections",
            "handshakes a rank's live SUB completed with the peer's PUB (again after every "
            "reconnect: batches the PUB sends before one are lost to it, and a gap or restart)",
            ["rank"],
            registry=r,
        )
        self.scrapes = Counter(
            "junction_bridge_scrapes", "peer metric scrapes, by outcome", ["outcome"], registry=r
        )

    def _add_store_metrics(self, r: CollectorRegistry) -> None:
        """What the bridge hands the control plane: its table and its outbox."""
        self.forwarded = Counter(
            "junction_bridge_forwarded_events",
            "Junction events handed to the control plane's outbox",
            registry=r,
        )
        self.table_resends = Counter(
            "junction_bridge_table_resends",
            "times the whole table was sent again (the outbox overflowed or the store lost it)",
            registry=r,
        )
        self.table_hashes = Gauge(
            "junction_bridge_table_hashes", "hashes in the bridge's table", registry=r
        )
        self.outbox_frames = Gauge(
            "junction_bridge_outbox_frames", "frames the store has not acknowledged", registry=r
        )
        self.connected = Gauge(
            "junction_bridge_connected", "1 while connected to the control plane", registry=r
        )

    def _add_feed_metrics(self, r: CollectorRegistry) -> None:
        """The cache feed the bridge serves to routers."""
        self.feed_unkeyed = Counter(
            "junction_bridge_feed_unkeyed_blocks",
            "blocks the cache feed could not key (their parent unknown: stored before the "
            "bridge started and not replayed, or evicted)",
            registry=r,
        )
        self.feed_keys = Gauge(
            "junction_bridge_feed_keys", "keys the cache feed announces", ["group"], registry=r
        )
        self.feed_subscribers = Gauge(
            "junction_bridge_feed_subscribers", "routers following the cache feed", registry=r
        )

    def value(self, name: str, **labels: str) -> float:
        """A sample's value (0 when absent): what tests and the benchmark read."""
        return self.registry.get_sample_value(name, labels) or 0.0
