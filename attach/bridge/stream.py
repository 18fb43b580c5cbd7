"""`RankStream`: one rank's batches, applied once each, in seq order.

The live socket (PUB/SUB) drops messages when the bridge falls behind its high-water mark or
is away; the replay socket keeps the peer's last batches. Per message of seq `s`, with `n` the
seq wanted next:

- `s == n`: applied.
- `s > n`: a gap `[n, s)`. The replay is asked from `n` and what it holds from `n` on is
  applied in order; whatever of `[n, s)` it no longer holds (or every seq of it, with no
  replay socket or no answer) is lost: one `PeerResync(first_missing_seq, resumed_seq,
  reason)` says so, and the stream goes on from there.
- `s < n`: a batch the replay already gave (same seq, same bytes: skipped), else the publisher
  restarted (its seq starts again from 0): the rank's cache is empty now, so
  `PeerCacheCleared` and `PeerResync(reason="publisher restart")` go out, and the stream starts
  over from seq 0 (the replay fills what of the new stream came before `s`).

At start the replay is asked from seq 0, so a bridge that comes late still starts exact while
the peer's buffer reaches back to its first batch.

A payload that is no batch is skipped (its seq counted as lost: a `PeerResync`); an event
that is no event is skipped and the rest of its batch applied. Each gets a log line and a
`junction_bridge_bad_frames_total{reason}` count.

What a stray or forged message could wreck is checked first (reason `forged`):

- A seq more than `MAX_SEQ_JUMP` past the one wanted, once live messages flow, is held until
  the next message: if that one follows it (seq + 1) the jump was real and both apply; if not,
  the held one is dropped (a lone seq of 2^62 would otherwise make every real message after it
  look like a restart).
- A seq going backwards, or a live batch that clears the cache, is checked against the replay
  when there is one: if the replay holds another payload at that seq, the message is dropped
  (no restart, no clear). A replay that holds the same payload, or none, lets it through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from attach.bridge.peer_wire import AllBlocksCleared, BadBatch, decode_batch
from attach.bridge.replay import ReplayClient
from attach.bridge.stats import BridgeStats
from attach.bridge.table import PeerTable
from attach.bridge.translate import BadEvent, translate
from engine.events import CacheEvent, PeerCacheCleared, PeerResync

log = logging.getLogger("attach.bridge")

RESTART = "publisher restart"
NO_REPLAY = "no replay socket"
NO_ANSWER = "the replay did not answer"
NOT_HELD = "the replay no longer holds them"
BAD_BATCH = "undecodable batch"
#: the most a live seq may jump ahead of the one wanted before it needs the next one to follow
MAX_SEQ_JUMP = 1 << 20


class RankStream:
    def __init__(
        self,
        rank: int,
        table: PeerTable,
        stats: BridgeStats,
        emit: Callable[[list[CacheEvent]], None],
        replay: ReplayClient | None = None,
        flavor: str = "vllm",
    ) -> None:
        self.rank = rank
        self.label = str(rank)
        self.table = table
        self.stats = stats
        self.emit = emit
        self.replay = replay
        self.flavor = flavor
        self.next_seq = 0
        # batches the replay gave that the live socket may still bring: seq -> hash(payload)
        self.replayed: dict[int, int] = {}
        self.last_ts: float | None = None
        self.is_restarting = False
        self.is_live = False  # a live message was applied: seqs are known to flow from here
        self.held: tuple[int, bytes] | None = None  # a far jump, waiting for its next seq

    # ------------------------------------------------------------------ the live socket
    def start(self) -> None:
        """Ask the replay for everything from seq 0 (the table starts exact if it still
        holds it)."""
        if self.replay is not None:
            self._fill(0, None)

    def on_message(self, seq: int, payload: bytes) -> None:
        """One live message."""
        if self.held is not None:
            held, self.held = self.held, None
            if seq == held[0] + 1:
                self._on_message(*held)  # the jump was real: its successor came
            else:
                self._forged(held[0], f"a seq {held[0] - self.next_seq} past {self.next_seq}")
        if self.is_live and not self.is_restarting and seq - self.next_seq > MAX_SEQ_JUMP:
            self.held = (seq, payload)
            return
        self._on_message(seq, payload)

    def _on_message(self, seq: int, payload: bytes) -> None:
        n = self.next_seq
        if seq == n:
            self.replayed.clear()  # caught up: no duplicate can come any more
            self._apply(seq, payload, live=True)
            self.is_live = True
            return
        if seq > n:
            self.stats.gaps.labels(self.label).inc()
            log.warning("rank %d: seqs %d..%d missing on the live socket", self.rank, n, seq - 1)
            self._fill(n, seq)
            if seq > self.next_seq:  # still short of it: the rest of the gap is lost
                self._resync(self.next_seq, seq, NO_REPLAY if self.replay is None else NOT_HELD)
            if seq == self.next_seq:
                self._apply(seq, payload, live=True)
                self.is_live = True
            elif seq < self.next_seq:  # the replay gave it too
                self._seen_again(seq, payload)
            return
        self._seen_again(seq, payload)

    def _seen_again(self, seq: int, payload: bytes) -> None:
        """A seq below the one wanted: a duplicate of a replayed batch, else a restart."""
        if self.replayed.get(seq) == hash(payload):
            self.stats.duplicates.labels(self.label).inc()
            return
        if self.is_restarting:  # the replay, asked after a restart, disagrees with it
            log.warning(
                "rank %d: seq %d is not what the replay holds for it: skipped", self.rank, seq
            )
            return
        if self._replay_holds(seq, payload) is False:
            self._forged(seq, f"a seq back from {self.next_seq - 1} the replay does not hold")
            return
        self._restart(seq, payload)

    def _replay_holds(self, seq: int, payload: bytes) -> bool | None:
        """Whether the replay holds `payload` at `seq`: None when it cannot say (no replay
        socket, no answer, or that seq no longer or not yet held)."""
        if self.replay is None:
            return None
        for held_seq, held in self.replay.fetch(seq).batches:
            if held_seq == seq:
                return held == payload
        return None

    def _forged(self, seq: int, what: str) -> None:
        self.stats.bad_frames.labels("forged").inc()
        log.warning("rank %d: seq %d dropped: %s", self.rank, seq, what)

    def _restart(self, seq: int, payload: bytes) -> None:
        if seq == 0:
            log.warning(
                "rank %d: seq back to 0 after %d: the publisher restarted; its cache "
                "is empty, clearing the rank",
                self.rank,
                self.next_seq - 1,
            )
        else:
            self.stats.bad_frames.labels("seq_backwards").inc()
            log.warning(
                "rank %d: seq went backwards from %d to %d: taking it for a publisher restart",
                self.rank,
                self.next_seq - 1,
                seq,
            )
        self.stats.restarts.labels(self.label).inc()
        self.table.cleared(self.rank)
        self.emit([PeerCacheCleared(rank=self.rank)])
        self._resync(self.next_seq, seq, RESTART, quiet=True)
        self.next_seq = 0
        self.replayed.clear()
        self.is_restarting = True
        try:
            self.on_message(seq, payload)  # from 0 again: a seq past 0 is a gap to fill
        finally:
            self.is_restarting = False

    # ------------------------------------------------------------------ the replay socket
    def _fill(self, start: int, until: int | None) -> None:
        """Apply what the replay holds from `start` on (changes `next_seq`); a loss before
        what it holds is a resync (unless `until` is None and nothing was missed)."""
        if self.replay is None:
            return
        answer = self.replay.fetch(start)
        if answer.num_bad:
            self.stats.bad_frames.labels("replay").inc(answer.num_bad)
            log.warning("rank %d: %d unreadable replay messages", self.rank, answer.num_bad)
        if not answer.is_complete and not answer.batches:
            if until is not None:
                self._resync(start, until, NO_ANSWER)
            return
        num_applied = 0
        for seq, payload in answer.batches:
            if seq < self.next_seq:
                continue
            if seq > self.next_seq:
                self._resync(self.next_seq, seq, NOT_HELD)
            self.replayed[seq] = hash(payload)
            self._apply(seq, payload)
            num_applied += 1
        if num_applied:
            self.stats.replayed.labels(self.label).inc(num_applied)
            log.info(
                "rank %d: %d batches from the replay (seq %d..%d)",
                self.rank,
                num_applied,
                start,
                self.next_seq - 1,
            )

    # ------------------------------------------------------------------ applying
    def _resync(self, first_missing: int, resumed: int, reason: str, quiet: bool = False) -> None:
        self.stats.resyncs.labels(self.label, reason).inc()
        if not quiet:
            log.warning(
                "rank %d: lost seqs %d..%d (%s): resync; the table may be off until "
                "the peer stores or removes those blocks again",
                self.rank,
                first_missing,
                resumed - 1,
                reason,
            )
        self.emit(
            [
                PeerResync(
                    rank=self.rank,
                    first_missing_seq=first_missing,
                    resumed_seq=resumed,
                    reason=reason,
                )
            ]
        )
        self.next_seq = max(self.next_seq, resumed)

    def _apply(self, seq: int, payload: bytes, live: bool = False) -> None:
        try:
            batch = decode_batch(payload, self.flavor)
        except BadBatch as exc:
            self.next_seq = seq + 1
            self.stats.next_seq.labels(self.label).set(self.next_seq)
            self.stats.bad_frames.labels("payload").inc()
            log.warning("rank %d: seq %d: %s", self.rank, seq, exc)
            self._resync(seq, seq + 1, BAD_BATCH, quiet=True)
            return
        clears = any(isinstance(e, AllBlocksCleared) for e in batch.events)
        if live and clears and self._replay_holds(seq, payload) is False:
            self._forged(seq, "a cache clear the replay does not hold")
            return  # the seq stays wanted: the real batch there applies when it comes
        self.next_seq = seq + 1
        self.stats.next_seq.labels(self.label).set(self.next_seq)
        if batch.bad_events:
            self.stats.bad_frames.labels("event").inc(len(batch.bad_events))
            log.warning(
                "rank %d: seq %d: skipped %d events: %s",
                self.rank,
                seq,
                len(batch.bad_events),
                "; ".join(batch.bad_events[:3]),
            )
        out: list[CacheEvent] = []
        for event in batch.events:
            try:
                out += translate(self.rank, event, self.table)
            except BadEvent as exc:
                self.stats.bad_frames.labels("unstorable").inc()
                log.warning("rank %d: seq %d: skipped an event: %s", self.rank, seq, exc)
        self.last_ts = batch.ts
        self.stats.batches.labels(self.label).inc()
        self.stats.events.labels(self.label).inc(len(batch.events))
        if out:
            self.emit(out)
