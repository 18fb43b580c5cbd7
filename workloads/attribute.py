"""One request's miss attribution from the records of the units earlier sequences held: the
online oracle's arithmetic, with no store behind it. The control plane reads the records from
its tables (`api.attribution.shared_units`, `api.attribution.tiers`); the engine keeps its own
in memory (`serve.diagnosis`); both call `attribute_units`, so a response's diagnosis and the
store's attribution of the same request are one computation over the same records.

A unit's `Record` says the earliest arrival that held it, the earliest finish of a sequence
holding it, and the latest epoch that held it with the earliest finish in that epoch. Its
`TierRecord`s say when each tier below the device took it and gave it up.

Where an evicted prefix went (`splitter`): the span `[start, end)` had been cached on the device
and was gone when the request came. Its units are the request's chain at positions `p`
(multiples of `U`); a tier holds a unit `H_p` for the attention of `[q, p)` and the state at
`p`. The deepest `p` in `(start, end]` whose unit some tier took before the request came splits
the span:

    [start, p)   the tier that gave that unit up last before the request came:
                 `evicted_host`, `evicted_disk` or `evicted_shared`; still held by one then
                 (the load was refused as slower than its prefill, or its chain was broken):
                 `evicted`, as without tiers
    [p, end)     `not_admitted`: no tier took these units (the state was unbacked, declined
                 by the eviction policy, refused by a full tier) before the request came
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from workloads.misses import Below, HitGrid, MatchStop, split_misses


class Record(NamedTuple):
    first_epoch: int  # the earliest arrival that held the unit: its epoch
    first_index: int  # and its arrival index
    first_finished_ts: float  # the earliest finish of a sequence holding it, any epoch
    last_epoch: int  # the latest epoch a sequence held it in
    last_epoch_finished_ts: float  # the earliest finish of one in that epoch


class TierRecord(NamedTuple):
    tier: str
    stored_ts: float
    removed_ts: float | None


class Subject(NamedTuple):
    """What attribution needs of one finished request: its place in the arrival order, its hit
    (H and A) and match stop, and its prompt's chain of unit hashes."""

    epoch: int
    arrival_index: int
    arrival_ts: float
    num_cached_tokens: int
    attention_hit_tokens: int
    match_stop: MatchStop
    units: Sequence[int]


def attribute_units(
    subject: Subject,
    records: Mapping[int, Record],
    grid: HitGrid,
    tiers: Mapping[int, list[TierRecord]] | None = None,
) -> tuple[int, dict[str, int]]:
    """The subject's shared length L (tokens) and its missed tokens by reason
    (`split_misses`'); `tiers` the tier records of its units on an engine with tiers below the
    device (None: none, `evicted` stays whole). Reads only its arguments."""
    arrival = (subject.epoch, subject.arrival_index)
    num_shared = num_finished = num_finished_now = 0
    for unit in subject.units:  # records are prefix-closed: stop at the first not shared
        record = records.get(unit)
        if record is None or (record.first_epoch, record.first_index) >= arrival:
            break
        # finish times only rise along a chain: the finished units are a leading run
        if num_finished == num_shared and record.first_finished_ts < subject.arrival_ts:
            num_finished += 1
            # and so are those finished in its own epoch (a later epoch's record says
            # nothing of this one: taken as held in it, as before restarts were told apart)
            if num_finished_now == num_shared and _held_this_epoch(record, subject):
                num_finished_now += 1
        num_shared += 1
    shared = num_shared * grid.unit
    below = None
    if tiers is not None:
        below = splitter(subject.units, subject.arrival_ts, grid.unit, tiers)
    missed = split_misses(
        subject.num_cached_tokens,
        subject.attention_hit_tokens,
        subject.match_stop,
        shared,
        num_finished * grid.unit,
        grid,
        num_finished_now * grid.unit,
        below,
    )
    return shared, missed


def _held_this_epoch(record: Record, subject: Subject) -> bool:
    """Whether a sequence of the subject's own epoch (or a later one) finished holding the unit
    before the subject came: else only an earlier epoch's did, and the restart emptied it."""
    if record.last_epoch != subject.epoch:
        return record.last_epoch > subject.epoch
    return record.last_epoch_finished_ts < subject.arrival_ts


def splitter(
    units: Sequence[int], arrival_ts: float, unit: int, found: Mapping[int, list[TierRecord]]
) -> Below:
    """`split_misses`' `below` for a request of chain `units` that came at `arrival_ts`, on an
    engine of match unit `unit`."""

    def below(start: int, end: int) -> dict[str, int]:
        for position in range(end // unit * unit, start, -unit):
            index = position // unit - 1
            if index >= len(units):
                continue
            taken = [r for r in found.get(units[index], ()) if r.stored_ts < arrival_ts]
            if taken:
                reason = _reason(taken, arrival_ts)
                return {reason: position - start, "not_admitted": end - position}
        return {"not_admitted": end - start}

    return below


def _reason(taken: list[TierRecord], arrival_ts: float) -> str:
    if any(r.removed_ts is None or r.removed_ts >= arrival_ts for r in taken):
        return "evicted"  # a tier still held it when the request came
    last = max(taken, key=lambda r: r.removed_ts or 0.0)
    return f"evicted_{last.tier}"
