"""`Fleet`: the engines behind one router, and the choice of one for each request.

`route` hashes the prompt once per match unit the fleet uses, scores every engine that is up
and serves the model (its usable hybrid hit from its index, what its host and disk tiers and
the fleet's shared store add beyond it and the seconds loading that takes, the hit a request
in flight there will leave, the hit requests that finished there leave until its feed confirms
them (`router/caches/expected.py`), its load), lets the policy pick, and records the
`Decision`: what each engine scored, its predicted prefill seconds, and why the request went
where it went, with where the prompt parts from the rest of the fleet
(`router/caches/branches.py`).
The last `max_decisions` decisions are kept for `GET /fleet/decisions`; `finish` adds the hit
the engine reported.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from engine.cache.lookup import reachable_hit
from engine.hashing import BlockHash, hash_prefix
from router.affinity import KeyAffinity
from router.caches.branches import branch_hint
from router.caches.index import DEFAULT_MAX_KEYS
from router.caches.tiers import SharedIndex, tier_hit
from router.engines import FleetEngine, InFlight
from router.policies import Candidate, Policy

DEFAULT_RUNNING_COST = 128  # prefill tokens a running request weighs in an engine's load
DEFAULT_MAX_DECISIONS = 10_000


@dataclass
class EngineScore:
    url: str
    engine_id: str | None
    hit: int  # the usable hybrid hit on its cache (its index's, or `expected` when more)
    attention: int  # its attention match
    in_flight: int  # the hit a request in flight there leaves
    load: int  # its queue in prefill tokens
    score: int  # what the policy ranked by: gain - load + credit
    gain: int = 0  # the gain the policy counted: 0 below the decision's `min_hit`
    credit: int = 0  # load not held against it (the producer's prefill this request reuses)
    # the usable hit by where it lives: "device" (its own hit), then the tokens its "host"
    # and "disk" tiers and the fleet's "shared" store add beyond it
    tier_hit: dict[str, int] = field(default_factory=dict)
    load_bytes: dict[str, int] = field(default_factory=dict)  # to load, by tier
    load_s: float = 0.0  # those bytes at the tiers' rates
    queue_s: float = 0.0  # its queue at its prefill rate
    # the request there: tokens left to compute at its prefill rate + load_s + queue_s
    predicted_s: float = 0.0
    # the hit requests that finished there leave, while its feed has not confirmed them
    expected: int = 0
    # how far the prompt matches what it holds, will hold or computes now, in tokens: its
    # attention match, the requests that finished or run there (`router.caches.branches`)
    reach: int = 0


@dataclass
class Decision:
    request_id: str  # the router's id; `engine_request_id` is the engine's
    ts: float
    model: str
    num_prompt_tokens: int
    url: str
    engine_id: str | None
    policy: str
    # "hit", "in_flight", "least_loaded", "round_robin", "random"; "cache_key" (the key's
    # engine kept) or "cache_key_spill" (too busy: the key moved; `router.affinity`)
    reason: str
    predicted_hit: int
    route_s: float  # hashing, scoring and choosing
    scores: list[EngineScore]
    failed_over_from: list[str] = field(default_factory=list)  # engines refused before sending
    engine_request_id: str | None = None
    realised_hit: int | None = None  # what the engine reported, once it finished
    status: str = "routed"  # "routed", "finished", "failed"
    min_hit: int = 0  # the least gain the policy counts (`--min-hit-share` of the prompt)
    predicted_s: float = 0.0  # the chosen engine's predicted prefill seconds
    predicted_load_s: float = 0.0  # of those, loading from the tiers
    cache_key: str | None = None  # the request's `prompt_cache_key`
    cache_key_home: str | None = None  # that key's engine before this request (None: new)
    # where the prompt parts from what the other engines hold, sent for the engine to keep a
    # state there (`router.caches.branches`; None: nothing it does not know)
    branch_hint: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


class _DeviceHit(NamedTuple):
    hit: int  # the usable hit on its device: its index's, or `expected` when more
    attention: int  # its index's attention match
    expected: int  # the usable hit requests that finished there leave (the feed may lag)
    expected_match: int  # the tokens those requests share with the prompt


def _device_hit(engine: FleetEngine, hashes: list[BlockHash], num_tokens: int) -> _DeviceHit:
    index = engine.index
    assert index is not None  # `up` engines have one
    found = index.hit(hashes, num_tokens)
    hit, attention = (found.length, found.attention_length) if found else (0, 0)
    shared = engine.expected.shared(hashes) * index.geometry.match_unit
    expected = reachable_hit(index.geometry, shared, num_tokens) if shared else 0
    return _DeviceHit(max(hit, expected), attention, expected, shared)


def _nowhere(key: BlockHash) -> None:
    """A tier that holds nothing (an engine's shared store it cannot reach)."""
    return None


class NoEngineError(RuntimeError):
    """No engine that serves the model is up."""


class Fleet:
    def __init__(
        self,
        engines: Iterable[FleetEngine],
        policy: Policy,
        running_cost: int = DEFAULT_RUNNING_COST,
        max_decisions: int = DEFAULT_MAX_DECISIONS,
        affinity: KeyAffinity | None = None,
        expectations: bool = True,
    ) -> None:
        """`expectations` False: a finished request leaves nothing expected, and engines are
        scored by their feeds' indexes alone (`--no-expectations`, for comparison)."""
        self.shared = SharedIndex(DEFAULT_MAX_KEYS)  # the shared store's units, fleet-wide
        self.engines: dict[str, FleetEngine] = {}
        for engine in engines:
            self.add(engine)
        self.policy = policy
        self.running_cost = running_cost
        self.max_decisions = max_decisions
        self.affinity = affinity or KeyAffinity()  # `prompt_cache_key`s' engines
        self.expectations = expectations  # what finished requests leave, until the feed says
        self.decisions: OrderedDict[str, Decision] = OrderedDict()
        self.num_agree = 0
        self.num_compared = 0

    def add(self, engine: FleetEngine) -> FleetEngine:
        engine.shared = self.shared
        self.engines[engine.url] = engine
        return engine

    def up(self, model: str | None = None) -> list[FleetEngine]:
        return [e for e in self.engines.values() if e.is_up and (model is None or e.model == model)]

    @property
    def models(self) -> list[str]:
        return sorted({e.model for e in self.engines.values() if e.model is not None})

    def max_request_tokens(self, model: str) -> int:
        lengths = [e.hello.max_request_tokens for e in self.up(model) if e.hello is not None]
        return max(lengths, default=0)

    # ------------------------------------------------------------------ routing
    def route(
        self,
        token_ids: Sequence[int],
        model: str,
        exclude: Sequence[str] = (),
        num_tokens_held: int = 0,
        *,
        record: bool = True,
        cache_key: str | None = None,
    ) -> Decision:
        """Choose an engine for a prompt whose request holds `num_tokens_held` prompt + output
        tokens (and sends `cache_key` as its `prompt_cache_key`); `NoEngineError` when no
        engine that serves `model` and takes that many is up (besides `exclude`). This records
        the decision and counts the request in flight there until `finish` or `fail`; with
        `record` False it changes nothing of the fleet (what this router would choose,
        `POST /fleet/route`), though `round_robin` and `random` still take their turn."""
        started = time.perf_counter()
        engines = [
            e
            for e in self.up(model)
            if e.url not in exclude and e.hello.max_request_tokens >= num_tokens_held
        ]
        if not engines:
            raise NoEngineError(model)
        num_tokens = len(token_ids)
        by_unit: dict[int, list[BlockHash]] = {}
        scored = [self._score(engine, token_ids, by_unit) for engine in engines]
        choice = self.policy.choose([candidate for candidate, _, _ in scored], num_tokens)
        seconds = {s.url: s.predicted_s for *_, s in scored}
        choice, home = self.affinity.steer(cache_key, choice, seconds, record)
        chosen = self.engines[choice.key]
        for candidate, _, score in scored:
            score.score = choice.scores[candidate.key]
            score.gain = choice.gains.get(candidate.key, 0)
            score.credit = choice.credits.get(candidate.key, 0)
        candidate, hashes, score = next(s for s in scored if s[0].key == choice.key)
        predicted = self._predicted(candidate)
        decision = Decision(
            request_id=f"route-{uuid.uuid4().hex}",
            ts=time.time(),
            model=model,
            num_prompt_tokens=num_tokens,
            url=chosen.url,
            engine_id=chosen.engine_id,
            policy=self.policy.name,
            reason=choice.reason,
            predicted_hit=predicted,
            route_s=time.perf_counter() - started,
            scores=[score for _, _, score in scored],
            failed_over_from=list(exclude),
            min_hit=choice.least_gain,
            predicted_s=score.predicted_s,
            predicted_load_s=score.load_s if candidate.tier_hit > candidate.in_flight else 0.0,
            cache_key=cache_key,
            cache_key_home=home,
        )
        if self.policy.knows_states and chosen.speaks_junction:
            decision.branch_hint = branch_hint(decision.scores, chosen.url, num_tokens)
        if not record:
            return decision
        chosen.num_routed += 1
        chosen.num_prompt_tokens += num_tokens
        chosen.num_predicted_tokens += predicted
        chosen.start(decision.request_id, InFlight(hashes, num_tokens, predicted))
        self.decisions[decision.request_id] = decision
        while len(self.decisions) > self.max_decisions:
            self.decisions.popitem(last=False)
        return decision

    def _predicted(self, candidate: Candidate) -> int:
        """The hit the chosen engine should report: its own lookup's, with the tiers (the
        device alone before them), or the in-flight producer's when the policy counts it."""
        if self.policy.name in ("hybrid", "lmetric"):
            return max(candidate.tier_hit, candidate.in_flight)
        if self.policy.name == "hybrid_device":
            return max(candidate.hit, candidate.in_flight)
        return candidate.hit

    def _score(
        self, engine: FleetEngine, token_ids: Sequence[int], by_unit: dict[int, list[BlockHash]]
    ) -> tuple[Candidate, list[BlockHash], EngineScore]:
        """One engine's candidate, the prompt's hashes at its match unit, and its score row
        (the policy's terms filled in by `route`)."""
        index = engine.index
        assert index is not None  # `up` engines have one
        unit, num_tokens = index.geometry.match_unit, len(token_ids)
        hashes = by_unit.get(unit)
        if hashes is None:
            hashes = by_unit[unit] = hash_prefix(token_ids, unit)
        hit, attention, expected, expected_match = _device_hit(engine, hashes, num_tokens)
        rates = engine.rates
        host, disk = index.tiers["host"].get, index.tiers["disk"].get
        shared = self.shared.get if rates.shared_up is not False else _nowhere  # it cannot load
        reach = max(attention, expected)  # the tiers load above what it holds or will
        tiers = tier_hit(
            index.geometry, (host, disk, shared), hashes, num_tokens, hit, reach, rates
        )
        computing = engine.in_flight_shared(hashes) * unit
        in_flight = reachable_hit(index.geometry, computing, num_tokens) if computing else 0
        load = engine.load_tokens(self.running_cost)
        rate = rates.prefill_tokens_per_s
        candidate = Candidate(
            engine.url,
            hit,
            attention,
            in_flight,
            load,
            engine.num_routed,
            max(tiers.length, hit),
            tiers.load_s,
            rate,
            engine.num_running,
        )
        best = max(candidate.tier_hit, in_flight)
        load_s = tiers.load_s if tiers.length > in_flight else 0.0
        score = EngineScore(
            engine.url,
            engine.engine_id,
            hit,
            attention,
            in_flight,
            load,
            0,
            tier_hit={"device": hit, **tiers.tokens},
            load_bytes=dict(tiers.num_bytes),
            load_s=tiers.load_s,
            queue_s=load / rate,
            predicted_s=(num_tokens - best + load) / rate + load_s,
            expected=expected,
            reach=max(attention, expected_match, computing),
        )
        return candidate, hashes, score

    def started(self, decision: Decision, engine_request_id: str) -> None:
        """The engine took the request under `engine_request_id` (its feed names that id)."""
        decision.engine_request_id = engine_request_id
        engine = self.engines[decision.url]
        entry = engine.in_flight.pop(decision.request_id, None)
        if entry is not None:
            engine.in_flight[engine_request_id] = entry

    def _end(self, decision: Decision) -> tuple[FleetEngine, InFlight | None]:
        """No longer in flight on its engine, under either id; the entry it had there."""
        engine = self.engines[decision.url]
        entry = engine.end(decision.request_id)
        if decision.engine_request_id is not None:
            entry = engine.end(decision.engine_request_id) or entry
        return engine, entry

    def finish(self, decision: Decision, realised_hit: int | None) -> None:
        """The engine answered; `realised_hit` is the `cached_tokens` it reported. Its prefix
        is expected on the engine until the feed confirms it (`FleetEngine.expect`), unless
        this fleet keeps no expectations."""
        engine, entry = self._end(decision)
        if entry is not None and self.expectations:
            engine.expect(decision.engine_request_id or decision.request_id, entry)
        decision.status = "finished"
        decision.realised_hit = realised_hit
        if realised_hit is not None:
            engine.num_realised_tokens += realised_hit
            self.num_compared += 1
            self.num_agree += realised_hit == decision.predicted_hit

    def fail(self, decision: Decision, reason: str) -> None:
        engine, _ = self._end(decision)
        engine.num_failed += 1
        decision.status = "failed"
        decision.reason = f"{decision.reason}; failed: {reason}"

    @property
    def agreement(self) -> float | None:
        """The share of finished requests whose realised hit equals the predicted one."""
        return self.num_agree / self.num_compared if self.num_compared else None
