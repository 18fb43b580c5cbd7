"""A finished request's record as it leaves the engine: the `RequestFinished` event.

Inside the engine a request keeps typed records (`MatchRecord` here, `CowCopy` on the request);
this is where they become the event's plain fields, whose JSON form the control plane reads.
"""

from __future__ import annotations

from typing import NamedTuple

from engine.events import ATTENTION, UNIT_HASH_BYTES, MatchStop, RequestFinished
from engine.hashing import short_hashes
from engine.request import Request


class MatchRecord(NamedTuple):
    """Where a request's attention match ended: what the control plane ranks junctions by and
    what pinning one needs."""

    pin_hits: dict[str, int]  # pin id -> the boundary the request's hit covered
    attention_match_key: str | None = None  # the key at the match's end; None under one unit
    junction_token_ids: list[int] | None = None  # the matched tokens, when no state was there


def match_record(request: Request, unit: int) -> MatchRecord:
    """The request's match record; `unit` is the engine's match unit. Reads only."""
    match = request.hit_tokens_by_group.get(ATTENTION, 0)
    if match < unit:
        return MatchRecord(dict(request.pin_hits))
    covered = (request.num_cached_tokens or 0) >= match
    return MatchRecord(
        dict(request.pin_hits),
        request.block_hashes[match // unit - 1].hex(),
        None if covered else request.prompt_token_ids[:match],
    )


def match_stop(request: Request) -> MatchStop:
    """Why the request's hit stopped where it did, from what its first admission saw: below
    the attention match a state was missing; at the match's EAGLE drop, or with the match at
    its limit, the hit was held back; short of what a request in flight was computing, that
    request had not registered it yet; otherwise nothing more was cached."""
    match = request.match
    proof, limit, in_flight = match.proof_length, match.proof_limit, match.in_flight
    hit = request.num_cached_tokens or 0
    attention = request.hit_tokens_by_group.get(ATTENTION, 0)
    if hit < attention:
        reason = "no_state"
    elif attention < proof or (limit and proof >= limit):
        reason = "held_back"
    elif in_flight > proof:
        reason = "in_flight"
    else:
        reason = "attention_ended"
    return MatchStop(reason, proof, limit, in_flight, request.num_copy_wait_steps)


def request_finished(
    request: Request, block_ids: dict[str, list[int | None]], unit: int, oldest_unfinished: int
) -> RequestFinished:
    """The event for a finished request; `block_ids` are its block tables before they were
    freed, `unit` the engine's match unit, `oldest_unfinished` the scheduler's
    `oldest_unfinished_index()` once this request has left it."""
    match = match_record(request, unit)
    return RequestFinished(
        request_id=request.request_id,
        num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=request.num_cached_tokens or 0,
        hit_tokens_by_group=dict(request.hit_tokens_by_group),
        num_computed_tokens=request.num_prefill_computed,
        num_output_tokens=len(request.output_token_ids),
        chunks=list(request.chunks),
        chunk_stop_reasons=list(request.chunk_stop_reasons),
        checkpoints=list(request.checkpoints),
        num_preemptions=request.num_preemptions,
        finish_reason=request.finish_reason,
        arrival_ts=request.arrival_ts,
        first_token_ts=request.first_token_ts,
        finished_ts=request.finished_ts,
        ttft_s=request.ttft_s,
        block_ids=block_ids,
        pin_hits=match.pin_hits,
        attention_match_key=match.attention_match_key,
        junction_token_ids=match.junction_token_ids,
        arrival_index=request.arrival_index,
        oldest_unfinished_index=oldest_unfinished,
        unit_hashes=short_hashes(request.block_hashes, UNIT_HASH_BYTES),
        match_stop=match_stop(request),
        arrival_step=request.arrival_step,
        checkpoint_offsets=list(request.checkpoint_offsets),
    )
