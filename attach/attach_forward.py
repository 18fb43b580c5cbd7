"""`junction attach`'s way to the control plane: the bridge's events as batches through the
engine's own publisher machinery (`Outbox`, `PublisherLink`): hello (a `CacheGeometry` of
`kind`, `physical_block_ids` false, `ranks`, `events`, `replay`, `metrics`), batches with seq, acks,
resend after a reconnect, the bounded outbox. When the outbox overflows, or the store lost
batches it no longer holds, the bridge sends an empty snapshot and then its whole table again
(`PeerTable.events`), so the store's guarantees hold end to end. A bridge start is a new
epoch: the store drops the old table, and the replay (asked from seq 0) rebuilds it.

Batches, live or the table's, are cut to fit one frame and a share of the outbox (`frames`).
A stored event too large for that alone (a block of a million tokens, a small `--outbox-bytes`)
goes without its token ids, counted (`bad_frames{reason="too_large"}`): the store keeps its
blocks whole, with no token sample (it keeps only a sample anyway). Were it put whole, no
outbox could ever hold it, and the table (which holds its tokens) would be sent again every
round for good, the batches after it never stored (issue 47, item 2). A table that does not
fit is sent again at most once a `RESEND_RETRY_S`, not every round.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from engine.events import PeerBlockStored, PeerMetrics, PeerResync
from publish.outbox import Outbox

if TYPE_CHECKING:
    from attach.bridge.bridge import Bridge
    from engine.events import CacheEvent
    from engine.wire import CacheGeometry
    from publish.publisher_link import PublisherLink

log = logging.getLogger("attach.bridge")

TABLE_EVENTS_PER_BATCH = 5000
#: a frame's share of the outbox's frame limit the events put in one batch may take (the
#: sizes below are estimates from above: msgpack ints of up to 5 bytes, hashes as strings)
FRAME_SHARE = 0.5
#: the outbox's bytes one batch may take: a quarter, so a batch always fits beside others
OUTBOX_SHARE = 0.25
EVENT_OVERHEAD_BYTES = 256
RESEND_RETRY_S = 1.0  # the least time between two tries of a table that did not fit


def event_bytes(event: CacheEvent) -> int:
    """At most the msgpack bytes of `event` (its token ids and hashes; the rest a constant)."""
    tokens = getattr(event, "token_ids", None) or ()
    hashes = getattr(event, "block_hashes", None) or ()
    return EVENT_OVERHEAD_BYTES + 5 * len(tokens) + sum(len(h) + 5 for h in hashes)


def frames(
    events: list[CacheEvent],
    max_bytes: int,
    max_events: int,
    bound: str = "one frame",
    on_stripped: Callable[[PeerBlockStored], None] | None = None,
) -> list[list]:
    """`events` in order, cut into batches of at most `max_events` whose estimated bytes stay
    within `max_bytes`; an event larger than that alone loses its token ids (logged, naming
    `bound`, the setting `max_bytes` comes from, and handed to `on_stripped`)."""
    batches: list[list] = []
    batch: list = []
    size = 0
    for event in events:
        n = event_bytes(event)
        if n > max_bytes and isinstance(event, PeerBlockStored):
            log.warning(
                "a stored event of %d blocks and %d token ids (about %d bytes) is larger than "
                "a batch may be (%d bytes: %s): forwarded without its token ids",
                len(event.block_hashes),
                len(event.token_ids),
                n,
                max_bytes,
                bound,
            )
            if on_stripped is not None:
                on_stripped(event)
            event = msgspec.structs.replace(event, token_ids=[])
            n = event_bytes(event)
        if batch and (size + n > max_bytes or len(batch) >= max_events):
            batches.append(batch)
            batch, size = [], 0
        batch.append(event)
        size += n
    if batch:
        batches.append(batch)
    return batches


class Forwarder:
    """The bridge's sink, on the bridge's thread: events into the outbox as batches; the
    whole table again when the outbox asks for a snapshot."""

    def __init__(self, bridge: Bridge, outbox: Outbox, engine_id: str, epoch: int) -> None:
        self.bridge, self.outbox = bridge, outbox
        self.engine_id, self.epoch = engine_id, epoch
        self.retry_at = 0.0  # a table that did not fit is tried again from then on

    @property
    def frame_bytes(self) -> int:
        return min(
            int(self.outbox.max_frame_bytes * FRAME_SHARE),
            int(self.outbox.max_bytes * OUTBOX_SHARE),
        )

    @property
    def bound(self) -> str:
        """The setting a batch's bytes come from, as the log names it."""
        frame = int(self.outbox.max_frame_bytes * FRAME_SHARE)
        if self.frame_bytes < frame:
            return f"a quarter of --outbox-bytes {self.outbox.max_bytes}"
        return f"half the {self.outbox.max_frame_bytes}-byte frame limit"

    def _batches(self, events: list[CacheEvent], max_events: int, count: bool) -> list[list]:
        """`frames` of `events`; the stored events it had to strip are counted when `count`
        (live ones: the table's were counted when they came)."""
        stripped: list[PeerBlockStored] = []
        batches = frames(events, self.frame_bytes, max_events, self.bound, stripped.append)
        if stripped and count:
            self.bridge.stats.bad_frames.labels("too_large").inc(len(stripped))
        return batches

    def _put(self, events: list[CacheEvent], ts: float) -> bool:
        from engine.wire import Batch

        return self.outbox.put_batch(
            lambda seq: Batch(
                engine_id=self.engine_id, epoch=self.epoch, seq=seq, ts=ts, events=events
            )
        )

    def __call__(self, events: list[CacheEvent]) -> None:
        if self.outbox.needs_snapshot and time.monotonic() >= self.retry_at:
            self.resend_table()
        if not events:
            return
        ts = time.time()
        for batch in self._batches(events, len(events), True):
            if not self._put(batch, ts):
                break
            self.bridge.stats.forwarded.inc(len(batch))
        else:
            return
        # the outbox is full: the table holds these events' effect on the blocks; what it
        # cannot hold (resyncs, metric samples) goes after it
        log.log(
            logging.WARNING if self.outbox.overflowed() else logging.DEBUG,
            "event outbox full (%d frames unacknowledged): sending the table again instead",
            self.outbox.num_buffered,
        )
        if time.monotonic() >= self.retry_at:
            self.resend_table()
        kept = [e for e in events if type(e) in (PeerResync, PeerMetrics)]
        if kept:
            self._put(kept, ts)

    def resend_table(self) -> None:
        from publish.publisher import put_snapshot

        # an empty table: the peer's blocks have no ids, its table follows as events
        put_snapshot(self.outbox, self.engine_id, self.epoch, [])
        ts, ranks = time.time(), self.bridge.ranks
        events = self.bridge.table.events(ranks)
        self.bridge.stats.table_resends.inc()
        log.warning("sending the whole table again: %d hashes", len(events) - len(ranks))
        for chunk in self._batches(events, TABLE_EVENTS_PER_BATCH, False):
            if not self._put(chunk, ts):
                log.error(
                    "the table (%d events) does not fit the outbox (%d bytes, %d frames): "
                    "raise --outbox-bytes or --outbox-batches; trying again in %.0f s",
                    len(events),
                    self.outbox.max_bytes,
                    self.outbox.max_batches,
                    RESEND_RETRY_S,
                )
                self.retry_at = time.monotonic() + RESEND_RETRY_S
                return


def peer_geometry(args: argparse.Namespace) -> CacheGeometry:
    """The bridge's hello geometry: the peer's kind and sockets, no physical block ids."""
    from engine.wire import CacheGeometry

    return CacheGeometry(
        kind=args.flavor,
        physical_block_ids=False,
        ranks=list(range(args.ranks)),
        events=args.events,
        replay=args.replay,
        metrics=args.metrics,
    )


def control_plane_link(
    args: argparse.Namespace, bridge: Bridge, epoch: int
) -> tuple[Forwarder, PublisherLink]:
    """The forwarder into the outbox and the link that streams it to `--control-plane`."""
    from engine.wire import SCHEMA_VERSION, Hello, new_instance_id
    from publish.publisher_link import Backoff, PublisherLink, ingest_url

    url = ingest_url(args.control_plane)
    outbox = Outbox(args.outbox_batches, args.outbox_bytes)
    hello = Hello(
        version=SCHEMA_VERSION,
        engine_id=args.engine_id,
        epoch=epoch,
        instance_id=new_instance_id(),
        geometry=peer_geometry(args),
        model={"name": args.model_name or args.engine_id, "source": args.flavor},
    )
    link = PublisherLink(
        outbox,
        url,
        args.token,
        hello,
        binary=True,
        backoff=Backoff(),
        open_timeout_s=5.0,
        max_frame_bytes=outbox.max_frame_bytes,
        on_command=lambda c: log.info("ignoring the control plane's %s command", c.command),
    )
    return Forwarder(bridge, outbox, args.engine_id, epoch), link
