"""Routing policies: each picks one engine among the candidates a request was scored on.

One class per policy, chosen by name from `POLICIES`. Every policy sees the same
`Candidate`s; they differ in what they count as the gain of sending the request there:

- `hybrid` (the default): the request's predicted prefill seconds there, least first: the
  tokens left to compute beyond its usable hybrid hit (its attention match backed by a
  recurrent state, docs/rules.md, on the device or loaded from its host or disk tier or the
  fleet's shared store), or beyond what a request of the same family being prefilled there
  right now will leave (the engine makes it wait for that producer), at the engine's prefill
  rate, plus the bytes to load from each tier at that tier's rate, plus its queue (queued
  prefill tokens and running requests, at its prefill rate);
- `hybrid_device`: the usable hybrid hit on the device alone, or the in-flight one, less the
  engine's load, in tokens (the hybrid policy before the tiers: kept for comparison);
- `lmetric`: LMetric's `uncached tokens x (requests in flight + 1)`, least first, over the same
  hit as `hybrid` (a load term to compare the seconds against);
- `attention`: the attention blocks matched, as attention-only routers score (NVIDIA Dynamo's
  KV router, llm-d's prefix scorer), less the same load: for a hybrid model it counts matches no
  state backs;
- `round_robin` and `random`: what a plain load balancer does.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import NamedTuple, Protocol


class Candidate(NamedTuple):
    key: str  # the engine's URL
    hit: int  # the usable hybrid hit on its cache now
    attention: int  # its attention match (after the EAGLE drop)
    in_flight: int  # the hit a same-family request being prefilled there will leave
    load: int  # its queue, in prefill tokens (running requests weighted)
    num_routed: int  # requests this router sent it so far
    tier_hit: int = 0  # the usable hit with what its tiers and the shared store add (>= hit)
    load_s: float = 0.0  # the seconds loading that tier hit's bytes takes
    prefill_tokens_per_s: float = 1.0  # its measured prefill rate
    num_in_flight: int = 0  # requests running or waiting there


class Choice(NamedTuple):
    key: str
    reason: str  # "hit", "in_flight", "least_loaded", "round_robin", "random"
    scores: dict[str, int]  # each candidate's score, by key
    # The score's terms, so a reader can add them up (score = gain - load + credit): the gain
    # counted (0 below `least_gain`), the load not held against it, and that least gain.
    gains: dict[str, int] = {}
    credits: dict[str, int] = {}
    least_gain: int = 0
    seconds: dict[str, float] = {}  # each candidate's predicted prefill seconds (`hybrid`)


class _Terms(NamedTuple):
    """What a scored policy weighs each candidate by, by key."""

    num_tokens: int
    scores: dict[str, int]
    credits: dict[str, int]
    seconds: dict[str, float]


class Policy(Protocol):
    name: str
    # whether it scores by recurrent states: then the router tells the engine where a state is
    # worth keeping (`router.caches.branches`); an attention-only scorer does not know
    knows_states: bool

    def choose(self, candidates: list[Candidate], num_tokens: int) -> Choice: ...


#: A gain below this share of the prompt counts as none: a chat template's shared header (a few
#: dozen tokens) would otherwise pull every request to the engine that saw it first, and the
#: fleet would cache on one engine's memory while the others idle (SGLang's router has such a
#: threshold too). `junction route --min-hit-share`.
DEFAULT_MIN_HIT_SHARE = 0.1


class _ScoredPolicy:
    """The largest `gain - load`; ties go to the lower load, then the fewer requests routed.
    (Breaking ties by the longer attention match was measured too, and lost: the fleet
    benchmark's families trace kept 97% of family affinity with it, 99% without.)"""

    name = ""
    knows_states = False

    def __init__(self, min_hit_share: float = DEFAULT_MIN_HIT_SHARE) -> None:
        self.min_hit_share = min_hit_share

    def gain(self, candidate: Candidate) -> int:
        raise NotImplementedError

    def credit(self, candidate: Candidate) -> int:
        """Load that is not a cost to this request."""
        return 0

    def choose(self, candidates: list[Candidate], num_tokens: int) -> Choice:
        least = self.min_hit_share * num_tokens
        gains = {c.key: g if (g := self.gain(c)) >= least else 0 for c in candidates}
        credits = {c.key: self.credit(c) if gains[c.key] else 0 for c in candidates}
        scores = {c.key: gains[c.key] - c.load + credits[c.key] for c in candidates}
        seconds = {c.key: self.seconds(c, num_tokens, gains[c.key]) for c in candidates}
        best = self.best(candidates, _Terms(num_tokens, scores, credits, seconds))
        if gains[best.key] <= 0:
            reason = "least_loaded"
        elif best.in_flight > max(best.tier_hit, best.hit, self._attention(best)):
            reason = "in_flight"
        else:
            reason = "hit"
        return Choice(best.key, reason, scores, gains, credits, math.ceil(least), seconds)

    def _attention(self, candidate: Candidate) -> int:
        return candidate.attention if self.name == "attention" else 0

    def best(self, candidates: list[Candidate], terms: _Terms) -> Candidate:
        scores = terms.scores
        return max(candidates, key=lambda c: (scores[c.key], -c.load, -c.num_routed))

    def seconds(self, candidate: Candidate, num_tokens: int, gain: int) -> float:
        """The request's predicted prefill seconds there, counting `gain` as not computed:
        the tokens left, the tier hit's loads when the gain is that hit, and the queue."""
        rate = candidate.prefill_tokens_per_s
        loads = candidate.load_s if gain and gain == candidate.tier_hit > candidate.hit else 0.0
        return (num_tokens - gain + candidate.load) / rate + loads


class DeviceHybridPolicy(_ScoredPolicy):
    name = "hybrid_device"
    knows_states = True

    def gain(self, candidate: Candidate) -> int:
        return max(candidate.hit, candidate.in_flight)

    def credit(self, candidate: Candidate) -> int:
        """The producer's prefill in the engine's queue is the work this request reuses: it is
        computed anyway, so it is not held against the engine (else a family's second request
        would leave the engine prefilling its first for an idle one, and compute it twice)."""
        if candidate.in_flight > candidate.hit:
            return min(candidate.in_flight, candidate.load)
        return 0


class HybridPolicy(DeviceHybridPolicy):
    """The least predicted prefill seconds (`seconds`, the producer's queued prefill this
    request reuses not held against it); ties go to the lower load, then the fewer routed.
    Where every engine states the same rates and no tier adds a hit, this is the device
    policy's choice: the seconds are its score over one rate."""

    name = "hybrid"

    def gain(self, candidate: Candidate) -> int:
        return max(candidate.tier_hit, candidate.hit, candidate.in_flight)

    def credit(self, candidate: Candidate) -> int:
        if candidate.in_flight > max(candidate.hit, candidate.tier_hit):
            return min(candidate.in_flight, candidate.load)
        return 0

    def best(self, candidates: list[Candidate], terms: _Terms) -> Candidate:
        def held(c: Candidate) -> float:
            return terms.seconds[c.key] - terms.credits[c.key] / c.prefill_tokens_per_s

        return min(candidates, key=lambda c: (held(c), c.load, c.num_routed))


class LMetricPolicy(_ScoredPolicy):
    """LMetric's placement: the fewest `uncached tokens x (requests in flight + 1)`, over the
    hit `hybrid` counts (device, tiers, in flight); ties to the lower load."""

    name = "lmetric"
    knows_states = True

    def gain(self, candidate: Candidate) -> int:
        return max(candidate.tier_hit, candidate.hit, candidate.in_flight)

    def best(self, candidates: list[Candidate], terms: _Terms) -> Candidate:
        def cost(c: Candidate) -> int:
            return max(terms.num_tokens - self.gain(c), 0) * (c.num_in_flight + 1)

        return min(candidates, key=lambda c: (cost(c), c.load, c.num_routed))


class AttentionPolicy(_ScoredPolicy):
    name = "attention"

    def gain(self, candidate: Candidate) -> int:
        return candidate.attention


class RoundRobinPolicy:
    name = "round_robin"
    knows_states = False

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, candidates: list[Candidate], num_tokens: int) -> Choice:
        ordered = sorted(candidates, key=lambda c: c.key)
        chosen = ordered[next(self._turn) % len(ordered)]
        return Choice(chosen.key, self.name, {c.key: 0 for c in candidates})


class RandomPolicy:
    name = "random"
    knows_states = False

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    def choose(self, candidates: list[Candidate], num_tokens: int) -> Choice:
        ordered = sorted(candidates, key=lambda c: c.key)
        chosen = self._random.choice(ordered)
        return Choice(chosen.key, self.name, {c.key: 0 for c in candidates})


POLICIES: dict[str, type] = {
    policy.name: policy
    for policy in (
        HybridPolicy,
        DeviceHybridPolicy,
        LMetricPolicy,
        AttentionPolicy,
        RoundRobinPolicy,
        RandomPolicy,
    )
}
DEFAULT_POLICY = "hybrid"


def make_policy(
    name: str, seed: int | None = None, min_hit_share: float = DEFAULT_MIN_HIT_SHARE
) -> Policy:
    """The policy called `name`; `ValueError` naming the choices for any other, or a share
    outside [0, 1]."""
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}: choose one of {', '.join(POLICIES)}")
    if not 0 <= min_hit_share <= 1:
        raise ValueError(f"--min-hit-share must lie in [0, 1], got {min_hit_share}")
    if name == "random":
        return RandomPolicy(seed)
    if name == "round_robin":
        return RoundRobinPolicy()
    return POLICIES[name](min_hit_share)
