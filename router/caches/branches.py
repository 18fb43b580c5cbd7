"""Where a prompt parts from what the rest of the fleet holds: a state its engine should keep.

An engine keeps a recurrent state where a prompt parts from the prompts it has seen itself
(its junctions, and the branch points its eviction policy learns). A prefix that the prompt
shares only with prompts other engines ran, or are computing now, is news to it: it computes
that prefix with no state at its end, and its next request of that prefix misses it too (a
chat template's header, a system prompt whose family spilled over from a busy engine, every
prefix on an engine just started). The router sees each engine's index, the requests in flight
on each and those that just finished there, so it knows where the prompt parts from the fleet:
the longest prefix it shares with any other engine, when that is longer than what the chosen
engine matches itself. The proxy sends that offset as `junction.checkpoint_offsets`, and the
engine keeps a state there as it keeps a message's end.

Only policies that know states send it (`hybrid`, `hybrid_device`, `lmetric`): an
attention-only router does not know where a state is worth keeping. A bridged peer's server is
not Junction and does not take it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from protocol.schemas import MAX_FLEET_OFFSETS


class Reach(Protocol):
    url: str
    hit: int  # the usable hybrid hit there
    reach: int  # how far the prompt matches what it holds, will hold or computes now


def branch_hint(scores: Sequence[Reach], chosen: str, num_tokens: int) -> int | None:
    """The offset where the prompt parts from the other engines' prefixes, when the engine at
    `chosen` should keep a state there: beyond what it matches itself (its own junction keeps
    that one) and inside the prompt; None otherwise. This changes nothing."""
    own = next(s for s in scores if s.url == chosen)
    elsewhere = max((s.reach for s in scores if s.url != chosen), default=0)
    if elsewhere <= max(own.reach, own.hit) or elsewhere >= num_tokens:
        return None
    return elsewhere


def with_hint(body: dict, hint: int | None) -> dict:
    """`body` with `hint` added to its `junction.checkpoint_offsets` (a copy; `body` itself
    when there is no hint or the body already names as many offsets as an engine takes)."""
    if hint is None:
        return body
    options = body.get("junction")
    options = options if isinstance(options, dict) else {}
    offsets = options.get("checkpoint_offsets")
    offsets = list(offsets) if isinstance(offsets, list) else []
    if len(offsets) >= MAX_FLEET_OFFSETS:
        return body
    return {**body, "junction": {**options, "checkpoint_offsets": [*offsets, hint]}}
