"""`junction route`'s answers: its fleet (`GET /fleet`) and its routing decisions
(`/fleet/decisions`, `/fleet/decisions/{id}`), in the shapes of `router.routes.fleet` and
`router.fleet.Decision`."""

from __future__ import annotations

from client.types.base import Body


class EngineLoad(Body):
    """An engine's queue: requests running and waiting, prefill tokens, usage by group."""

    num_running: int
    num_waiting: int
    num_prefill_tokens: int
    usage: dict[str, float]


class FleetEngine(Body):
    """One engine behind the router: its state, keys by group, load and share of the routed
    requests, the hits predicted and realised."""

    url: str
    serve_url: str
    engine_id: str | None
    model: str | None
    status: str
    down_reason: str | None
    last_frame_age_s: float | None
    num_keys: dict[str, int]
    load: EngineLoad
    num_in_flight: int
    num_routed: int
    routed_share: float
    num_prompt_tokens: int
    num_predicted_tokens: int
    num_realised_tokens: int
    hit_rate: float
    num_failed: int
    num_snapshots: int
    # the units its host and disk tiers hold, by tier, as its feed announced them
    num_tier_keys: dict[str, int] = {}
    # the rates it is priced at (`prefill_tokens_per_s`, `host_bytes_per_s`, ...), and whether
    # its feed stated them (else they are the router's defaults)
    rates: dict[str, float | None] = {}
    rates_measured: bool = False
    shared_store: str | None = None  # "up" or "down" as its feed says; None: it has none
    # requests finished there that its feed has not confirmed (scored as cache, not load)
    num_expected: int = 0


class WaitedFor(Body):
    """An engine the router is not routing to yet: `connecting` (no snapshot yet) or `down`."""

    url: str
    engine_id: str | None
    status: str
    since: float  # Unix seconds: when the router began waiting for it


class FleetView(Body):
    """The fleet: the policy, requests routed, how often the predicted hit was the realised one
    (`agreement` over `num_compared`; None before any), each engine, and the fleet's status:
    `ready` (every engine in), `degraded` (routing by the engines up, waiting for the others)
    or `no_engine`."""

    policy: str
    num_routed: int
    agreement: float | None
    num_compared: int
    engines: list[FleetEngine]
    num_shared_keys: int = 0  # the shared store's units some engine announced, not expired
    shared_store: str | None = None  # which engines cannot reach their shared store, if any
    status: str = "ready"
    waiting_for: list[WaitedFor] = []
    degraded_since: float | None = None  # Unix seconds: the longest wait's start
    ready_after_s: float | None = None  # the router's start to every engine in, the first time


class EngineScore(Body):
    url: str
    engine_id: str | None
    hit: int  # the usable hybrid hit on its cache (its index's, or `expected` when more)
    attention: int  # its attention match
    in_flight: int  # the hit a request in flight there leaves
    load: int  # its queue in prefill tokens
    score: int  # what the policy ranked by: gain - load + credit
    gain: int = 0  # the gain the policy counted: 0 below the decision's `min_hit`
    credit: int = 0  # load not held against it (the producer's prefill this request reuses)
    # the usable hit by where it lives: "device", then what "host", "disk", "shared" add
    tier_hit: dict[str, int] = {}
    load_bytes: dict[str, int] = {}  # bytes to load, by tier
    load_s: float = 0.0  # those bytes at the tiers' rates
    queue_s: float = 0.0  # its queue at its prefill rate
    predicted_s: float = 0.0  # tokens left at its prefill rate + load_s + queue_s
    # the hit requests finished there leave while its feed has not said so (in `hit`)
    expected: int = 0
    reach: int = 0  # how far the prompt matches what it holds, computes or just finished


class Decision(Body):
    """Why one request went where it went: every engine's score, the reason, the hit
    predicted and (once finished) the one the engine reported."""

    request_id: str  # the router's id; `engine_request_id` is the engine's
    ts: float
    model: str
    num_prompt_tokens: int
    url: str
    engine_id: str | None
    policy: str
    # "hit", "in_flight", "least_loaded", "round_robin", "random", "cache_key", "cache_key_spill"
    reason: str
    predicted_hit: int
    route_s: float
    scores: list[EngineScore]
    failed_over_from: list[str] = []
    engine_request_id: str | None = None
    realised_hit: int | None = None
    status: str = "routed"  # "routed", "finished", "failed"
    min_hit: int = 0  # the least gain the policy counts (`--min-hit-share` of the prompt)
    predicted_s: float = 0.0  # the chosen engine's predicted prefill seconds
    predicted_load_s: float = 0.0  # of those, loading from the tiers
    cache_key: str | None = None  # the request's `prompt_cache_key`
    cache_key_home: str | None = None  # that key's engine before this request (None: new)
    # where the prompt parts from what the other engines hold: the engine keeps a state there
    branch_hint: int | None = None


class DecisionPage(Body):
    """`GET /fleet/decisions`: the latest decisions, newest first."""

    decisions: list[Decision]
