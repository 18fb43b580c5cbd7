"""The split of a request's missed tokens by reason: pure arithmetic, no store. The control
plane's attribution at ingest (`api.attribution.record`) and the engine's diagnosis of its own
requests (`serve.diagnosis`) both split by it, so the two agree token for token.

Symbols (all token positions, multiples of the match unit `U`):

    H      the hit (`num_cached_tokens`)
    A      the attention match after the EAGLE drop and the grid floor (`hit_tokens_by_group`)
    proof  the attention match before the drop (`match_stop.attention_tokens`)
    limit  the most that proof could reach (`match_stop.limit_tokens`)
    F      how far a request in flight was computing the prefix (`match_stop.in_flight_tokens`)
    L      the prefix truly shared with an earlier arrival or a pin (the online oracle)
    E      the end of the shared units that some sequence had finished before this request came
    N      the end of those finished in this request's own epoch (N <= E): the rest finished
           only before the engine restarted, whose cache a restart empties
    R      the end a hit could reach: L, floored to the hit grid when hits are coarse

The engine guarantees H <= A <= proof <= limit. The tokens of [H, max(L, H)) are each given
one reason, so the hit plus the missed tokens is max(L, H):

    [H, A)                  no_state    attention matched; no recurrent state was there
    [A, proof)              held_back   the EAGLE drop (or the grid floor) took them off
    [proof, R)              held_back   when proof >= limit: a hit never covers a whole prompt
    [proof, F)              in_flight   a request in flight was computing them
    [max(proof, F), N)      evicted     finished (so cached) before it came, gone when it did
    [max(proof, F, N), E)   restarted   finished before the engine restarted: its cache was empty
    [max(proof, F, E), R)   in_flight   still being computed by an earlier arrival
    [R, L)                  held_back   coarse hits stop at the grid below L

On an engine with tiers below the device (`workloads.attribute.splitter`), `evicted` is split by
where the prefix went after the device gave it up: `evicted_host`, `evicted_disk` or
`evicted_shared` up to the deepest unit a tier had taken and then given up (or still held:
then it stays `evicted`), and `not_admitted` past it (no tier ever took those units).

`copy_pending` is always 0 tokens: the engine waits for a pending copy rather than miss it
(`match_stop.copy_wait_steps` counts the steps it waited).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple, get_args

from engine.geometry import CacheGeometry

MissReason = Literal[
    "no_state",
    "in_flight",
    "held_back",
    "evicted",
    "evicted_host",
    "evicted_disk",
    "evicted_shared",
    "not_admitted",
    "restarted",
    "copy_pending",
]
REASONS: tuple[str, ...] = get_args(MissReason)
#: splits an evicted span `[start, end)` by tier (`workloads.attribute.splitter`): tokens by reason
Below = Callable[[int, int], dict[str, int]]


class HitGrid(NamedTuple):
    """Where an engine's hits may land: what the split needs of its hello's geometry."""

    unit: int  # the match unit U (`prefix_match_unit`)
    eagle: bool
    partial_hits: bool  # fine-grained hits; False: hits land on the `alignment` grid only
    alignment: int  # the hit grid (`hit_alignment`)
    has_tiers: bool = False  # tiers below the device (`tier_bytes`): evicted is split by them

    @classmethod
    def of(cls, geometry: CacheGeometry) -> HitGrid | None:
        """The engine's hit grid, or None when its hello does not say the match unit (a
        bridged engine's)."""
        unit = geometry.prefix_match_unit
        if unit is None:
            return None
        return cls(
            unit,
            bool(geometry.eagle),
            geometry.partial_hits is not False,  # not reported: partial, the engine's default
            geometry.hit_alignment or unit,
            bool(geometry.tier_bytes),
        )


class MatchStop(NamedTuple):
    """`RequestFinished.match_stop`, as the store keeps it (a JSON object)."""

    reason: str
    attention_tokens: int
    limit_tokens: int
    in_flight_tokens: int = 0
    copy_wait_steps: int = 0


def split_misses(
    hit: int,
    attention: int,
    stop: MatchStop,
    shared: int,
    finished: int,
    grid: HitGrid,
    finished_this_epoch: int | None = None,
    below: Below | None = None,
) -> dict[str, int]:
    """The tokens of [hit, max(shared, hit)) by reason (every reason a key); `attention` is A,
    `shared` L, `finished` E and `finished_this_epoch` N of the module's table (None: E, every
    finish in this epoch); `below` splits the evicted span by tier (None: all `evicted`).
    Reads only its arguments."""
    missed = dict.fromkeys(REASONS, 0)
    if shared <= hit:
        return missed
    reach = shared
    if not grid.partial_hits:
        reach = shared // grid.alignment * grid.alignment

    def add(reason: str, start: int, end: int) -> None:
        missed[reason] += max(0, min(end, reach) - max(start, hit))

    proof, in_flight = stop.attention_tokens, stop.in_flight_tokens
    add("no_state", hit, attention)
    add("held_back", attention, proof)
    if proof >= stop.limit_tokens:
        add("held_back", proof, reach)
    else:
        add("in_flight", proof, in_flight)
        rest = max(proof, in_flight)
        now = finished if finished_this_epoch is None else min(finished_this_epoch, finished)
        start, end = max(rest, hit), min(now, reach)
        if below is not None and end > start:
            for reason, tokens in below(start, end).items():
                missed[reason] += tokens
        else:
            add("evicted", rest, now)
        add("restarted", max(rest, now), finished)
        add("in_flight", max(rest, finished), reach)
    missed["held_back"] += shared - max(reach, hit)
    return missed


#: What to do about each reason's missed tokens, one line each: what a response's diagnosis
#: (`serve.diagnosis`) and the dashboard's request detail show beside the tokens. The one place
#: these texts live; the flags are `junction serve`'s.
REMEDIES: dict[str, str] = {
    "no_state": "attention matched but no recurrent state was kept there: mark the shared "
    "prefix's end (a cache_control breakpoint, checkpoint_offsets, or chat messages), keep "
    "--junction-checkpoints on, or lower --checkpoint-interval",
    "in_flight": "an earlier request was still computing this prefix: send the requests that "
    "share it after the first one's prefill, raise --max-prefix-wait-steps, or warm the prefix "
    "with a pin",
    "held_back": "the hit never covers a whole prompt (its last token is computed), and EAGLE "
    "or a coarse hit grid drops a unit: expected, nothing to change",
    "evicted": "cached, then evicted before this request came: more device blocks "
    "(--num-blocks, --kv-cache-memory), a host tier (--host-cache-bytes), or keep the prefix "
    "(a cache_control TTL, prompt_cache_retention 24h, a pin)",
    "evicted_host": "evicted from the device, then from host memory too: raise "
    "--host-cache-bytes, or add a disk tier (--disk-cache-dir)",
    "evicted_disk": "evicted from the device and from the disk tier: raise --disk-cache-bytes",
    "evicted_shared": "evicted from the device and from the shared store: give the store more "
    "room, or keep the prefix with a pin",
    "not_admitted": "evicted from the device and no tier took it: a host or disk tier "
    "(--host-cache-bytes, --disk-cache-dir), or one with room (a full tier refuses units)",
    "restarted": "cached before the engine restarted, which emptied its cache: a disk tier "
    "(--disk-cache-dir) keeps units across restarts",
    "copy_pending": "never counted: the engine waits for a pending checkpoint copy instead",
}


def remedies(missed: dict[str, int]) -> dict[str, str]:
    """The remedy of each reason that missed tokens, in `REASONS` order."""
    return {reason: REMEDIES[reason] for reason in REASONS if missed.get(reason, 0) > 0}
