"""Routing policies: each picks one engine among the candidates a request was scored on.

One class per policy, chosen by name from `POLICIES`. Every policy sees the same
`Candidate`s; they differ in what they count as the gain of sending the request there:

- `hybrid` (the default): the usable hybrid hit, the tokens that engine would really not
  compute (its attention match backed by a recurrent state, docs/rules.md), or what a request
  of the same family being prefilled there right now will leave (the engine makes it wait for
  that producer), less the engine's load;
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


class Choice(NamedTuple):
    key: str
    reason: str  # "hit", "in_flight", "least_loaded", "round_robin", "random"
    scores: dict[str, int]  # each candidate's score, by key
    # The score's terms, so a reader can add them up (score = gain - load + credit): the gain
    # counted (0 below `least_gain`), the load not held against it, and that least gain.
    gains: dict[str, int] = {}
    credits: dict[str, int] = {}
    least_gain: int = 0


class Policy(Protocol):
    name: str

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
        best = max(candidates, key=lambda c: (scores[c.key], -c.load, -c.num_routed))
        if gains[best.key] <= 0:
            reason = "least_loaded"
        elif best.in_flight > max(best.hit, best.attention if self.name == "attention" else 0):
            reason = "in_flight"
        else:
            reason = "hit"
        return Choice(best.key, reason, scores, gains, credits, math.ceil(least))


class HybridPolicy(_ScoredPolicy):
    name = "hybrid"

    def gain(self, candidate: Candidate) -> int:
        return max(candidate.hit, candidate.in_flight)

    def credit(self, candidate: Candidate) -> int:
        """The producer's prefill in the engine's queue is the work this request reuses: it is
        computed anyway, so it is not held against the engine (else a family's second request
        would leave the engine prefilling its first for an idle one, and compute it twice)."""
        if candidate.in_flight > candidate.hit:
            return min(candidate.in_flight, candidate.load)
        return 0


class AttentionPolicy(_ScoredPolicy):
    name = "attention"

    def gain(self, candidate: Candidate) -> int:
        return candidate.attention


class RoundRobinPolicy:
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, candidates: list[Candidate], num_tokens: int) -> Choice:
        ordered = sorted(candidates, key=lambda c: c.key)
        chosen = ordered[next(self._turn) % len(ordered)]
        return Choice(chosen.key, self.name, {c.key: 0 for c in candidates})


class RandomPolicy:
    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    def choose(self, candidates: list[Candidate], num_tokens: int) -> Choice:
        ordered = sorted(candidates, key=lambda c: c.key)
        chosen = self._random.choice(ordered)
        return Choice(chosen.key, self.name, {c.key: 0 for c in candidates})


POLICIES: dict[str, type] = {
    policy.name: policy
    for policy in (HybridPolicy, AttentionPolicy, RoundRobinPolicy, RandomPolicy)
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
