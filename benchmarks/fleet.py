"""Routing a fleet by hybrid hit: one trace, the same engines, every placement, in one run.

Real `junction serve --runner null` engines (equal memory each), started fresh for every
placement, with `junction route` in front of them:

- round-robin and random (what a plain load balancer does);
- an attention-only prefix scorer (`--policy attention`: blocks matched, as Dynamo's KV
  router and llm-d's prefix scorer count them);
- Junction's hybrid score (`--policy hybrid`, the default);
- each family always on the same engine (the benchmark sends it there itself);
- one engine holding the whole memory.

Printed per trace: hit tokens as a share of the oracle and of the one-engine figure, the spread
of requests over engines (busiest / mean and max / min), the router's routing time per request
(p50 / p99, from its decisions), the share of requests whose realised hit equalled the
predicted one, and what the client saw: each request's seconds from sending to its whole
answer (p50 / p99) and the trace's wall seconds. Traces:

- `families`: 24 families of 1000-5000-token system prompts, 10 questions each, shuffled;
- `scarce`: system prompts ending inside a Mamba block and a state pool of a few slots per
  engine, after the fleet ran the same families behind a plain balancer (every engine holds
  attention blocks of most families, few still hold a state): an attention match without a
  state misleads an attention-only scorer;
- `uniform`: prompts that share only a chat template's 32-token header, 8 in flight: the
  busiest engine's share;
- `chats`: 16 families of 1000-3000-token system prompts, 8 questions each, asked as chat
  sessions (a family's next question as soon as its last is answered, 8 sessions at a time):
  the next question reaches the router while the engine's feed may still be reporting the
  last one;
- `tiers`: device pools of a few states and a host tier on every engine, its rates declared
  (`--prefill-tokens-per-s`, `--host-bytes-per-s`), after a plain balancer spread the families
  over the fleet: most hits live in some engine's host memory, which a router scoring the
  device alone (`--policy hybrid_device`) does not see.

Placements also include `hybrid_device` (the hybrid score before the tiers: the device's hit
in tokens), `lmetric` (LMetric's `uncached tokens x (requests in flight + 1)` over the same
hit as `hybrid`, against which the hybrid policy's queue term in seconds is compared) and, run
only when named, "hybrid (no expectations)" (`junction route --no-expectations`: the hybrid
score over the feeds' indexes alone, keeping nothing of a finished request the feed has not
reported; issue 50). Printed
besides: the seconds the engines' tier loads took (`junction_tier_loaded_bytes` at the host
rate) and the prefill seconds of the run at the trace's rates (tokens computed / prefill rate
+ those load seconds).

With `--busy`, every trace runs twice in one invocation: on the machine as it is ("idle"),
then beside a CPU burner of the benchmark's own (`--burners` processes spinning from the
engines' start to the run's end, default one per CPU), where the engines and their feeds lag;
then the hybrid router's hit tokens over family affinity's and over attention-only's, per trace
and condition (issue 50: a router that learns where a prefix is from the feed alone slips when
the feed lags, since a family's next request arrives before its predecessor's blocks are in
the index).

A feed that lags past the router's wait for it: `--finish-wait-s S` is every routed
placement's `junction route --finish-wait-s` (how long an answer's end waits for the engine's
feed to report the request; 0: not at all), and `--feed-delay-s S` puts a proxy in front of
each engine (`benchmarks.feed_delay`) that holds its cache feed back S seconds on its way to
the router, requests and answers passing at once. On an idle machine the feed's word that a
request finished reaches the router before a session's next question does, even with no
wait; held back 0.3 s with no wait, the `chats` trace's next question comes before its
predecessor's blocks are in the index, which is where "hybrid (no expectations)" and `hybrid`
part (`--traces chats --placements hybrid,"hybrid (no expectations)","family affinity"
--finish-wait-s 0 --feed-delay-s 0.3`).

Then the router alone, in-process: 8 engines, 100k indexed keys, the time to route a request.

    .venv/bin/python benchmarks/fleet.py [--engines 4] [--concurrency N] [--busy [--burners N]]
        [--traces families,...] [--placements hybrid,...] [--finish-wait-s S]
        [--feed-delay-s S] [--skip-scale]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `benchmarks.ports` is beside it
    sys.path.insert(0, str(ROOT))

from benchmarks.feed_delay import FeedDelay  # noqa: E402
from benchmarks.ports import free_port  # noqa: E402
from engine.traces.trace import TraceRequest, segment_tokens  # noqa: E402
from router.caches.tiers import DEFAULT_RATES  # noqa: E402
from workloads.oracle import oracle  # noqa: E402

JUNCTION = [sys.executable, "-m", "cli.main"]
MODEL = "junction-hybrid-tiny"
UNIT = 16
TOKEN = "fleet-benchmark-token"


@dataclass(frozen=True)
class Prompt:
    family: int
    token_ids: list[int]
    system_len: int
    slot: int = 0  # the engine (modulo their number) a warm-up prompt went to


@dataclass(frozen=True)
class Trace:
    name: str
    prompts: list[Prompt]
    engine_options: list[str]  # each engine's cache options
    one_engine_options: list[str]  # the single engine with the whole memory
    concurrency: int
    warmup: list[Prompt] = field(default_factory=list)  # sent first, each to its `slot`
    # prefill tokens/s and host bytes/s: the engines' declared rates, or the router's defaults
    rates: tuple[float, float] = (
        DEFAULT_RATES.prefill_tokens_per_s,
        DEFAULT_RATES.host_bytes_per_s,
    )
    sessions: bool = False  # each family's prompts in turn, `concurrency` families at a time


def families_trace(seed: int, num_engines: int) -> Trace:
    rng = random.Random(seed)
    prompts = []
    for family in range(24):
        system = segment_tokens(seed * 1000 + family, rng.randint(1000, 5000))
        for question in range(10):
            asked = segment_tokens(seed * 1000 + 500 + family * 10 + question, rng.randint(64, 256))
            prompts.append(Prompt(family, system + asked, len(system)))
    rng.shuffle(prompts)
    blocks = 4000
    return Trace(
        "families",
        prompts,
        ["--num-blocks", str(blocks // num_engines), "--num-mamba-blocks", "128"],
        ["--num-blocks", str(blocks), "--num-mamba-blocks", str(128 * num_engines)],
        1,
    )


def chats_trace(seed: int, num_engines: int) -> Trace:
    rng = random.Random(seed + 4)
    prompts = []
    for family in range(16):
        system = segment_tokens(seed * 11000 + family, rng.randint(1000, 3000))
        for question in range(8):
            asked = segment_tokens(seed * 13000 + family * 10 + question, rng.randint(64, 256))
            prompts.append(Prompt(family, system + asked, len(system)))
    return Trace(
        "chats",
        prompts,
        ["--num-blocks", "1000", "--num-mamba-blocks", "128"],
        ["--num-blocks", str(1000 * num_engines), "--num-mamba-blocks", str(128 * num_engines)],
        8,
        sessions=True,
    )


def scarce_trace(seed: int, num_engines: int) -> Trace:
    rng = random.Random(seed + 1)
    systems = []
    for family in range(24):
        length = rng.randint(600, 1900)
        length += 16 if length % 512 == 0 else 0  # ends inside a Mamba block
        systems.append(segment_tokens(seed * 2000 + family, length))

    def ask(family: int, question: int, slot: int = 0) -> Prompt:
        asked = segment_tokens(seed * 3000 + family * 100 + question, rng.randint(32, 128))
        return Prompt(family, systems[family] + asked, len(systems[family]), slot)

    # the traffic the fleet ran behind a plain balancer before: each family once on each engine
    warmup = [
        ask(family, 90 + turn, family + turn) for turn in range(num_engines) for family in range(24)
    ]
    prompts = [ask(family, question) for family in range(24) for question in range(8)]
    rng.shuffle(prompts)
    return Trace(
        "scarce",
        prompts,
        ["--num-blocks", "8000", "--num-mamba-blocks", "12"],
        ["--num-blocks", str(8000 * num_engines), "--num-mamba-blocks", str(12 * num_engines)],
        1,
        warmup,
    )


def uniform_trace(seed: int, num_engines: int) -> Trace:
    """Prompts that share only a 32-token header (a chat template's), 8 in flight."""
    rng = random.Random(seed + 2)
    header = segment_tokens(seed * 5000 + 4999, 32)
    prompts = [
        Prompt(i, header + segment_tokens(seed * 5000 + i, rng.randint(1000, 2000)), 0)
        for i in range(240)
    ]
    return Trace(
        "uniform",
        prompts,
        ["--num-blocks", "1000", "--num-mamba-blocks", "128"],
        ["--num-blocks", str(1000 * num_engines), "--num-mamba-blocks", str(128 * num_engines)],
        8,
    )


def tiers_trace(seed: int, num_engines: int) -> Trace:
    """48 families of 800-1600-token system prompts, each asked once by a plain balancer first
    (family f on engine f mod N: the fleet's host tiers hold a share each), then 6 questions
    each, shuffled. A device pool keeps about 3 families' attention and 4 spare states: between
    two questions of a family the engine that ran it has run a dozen others, so its prefix is
    in that engine's host memory, rarely on its device."""
    rng = random.Random(seed + 3)
    systems = [segment_tokens(seed * 7000 + f, rng.randint(800, 1600)) for f in range(48)]

    def ask(family: int, question: int, slot: int = 0) -> Prompt:
        asked = segment_tokens(seed * 9000 + family * 100 + question, rng.randint(32, 128))
        return Prompt(family, systems[family] + asked, len(systems[family]), slot)

    warmup = [ask(family, 90, family) for family in range(48)]
    prompts = [ask(family, question) for family in range(48) for question in range(6)]
    rng.shuffle(prompts)
    rates = (20_000.0, 10e9)
    declared = [
        "--prefill-tokens-per-s", str(rates[0]), "--host-bytes-per-s", str(rates[1]),
        "--host-cache-bytes", "2GiB",
    ]  # fmt: skip
    return Trace(
        "tiers",
        prompts,
        ["--num-blocks", "300", "--num-mamba-blocks", "12", *declared],
        [
            "--num-blocks",
            str(300 * num_engines),
            "--num-mamba-blocks",
            str(12 * num_engines),
            *declared,
        ],  # fmt: skip
        1,
        warmup,
        rates,
    )


@dataclass(frozen=True)
class Lag:
    """What lags in every run of an invocation: the routers' `--finish-wait-s` (None: their
    default) and how long each engine's cache feed is held back on its way to the router
    (`benchmarks.feed_delay`; 0: not at all)."""

    finish_wait_s: float | None = None
    feed_delay_s: float = 0.0

    @property
    def router_options(self) -> list[str]:
        return [] if self.finish_wait_s is None else ["--finish-wait-s", f"{self.finish_wait_s:g}"]

    def __str__(self) -> str:
        wait = "default" if self.finish_wait_s is None else f"{self.finish_wait_s:g} s"
        return f"routers' finish wait {wait}, feeds held back {self.feed_delay_s:g} s"


# ---------------------------------------------------------------------- processes
class Processes:
    """Engines and a router as child processes; stopped together."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str]) -> None:
        env = {**os.environ, "JUNCTION_API_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
        env.pop("JUNCTION_CONTROL_PLANE_URL", None)
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the child
        self.children.append(
            subprocess.Popen([*JUNCTION, *args], cwd=ROOT, env=env, stdout=log, stderr=log)
        )

    def stop(self) -> None:
        for child in self.children:
            child.terminate()
        for child in self.children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
        self.children = []


def wait_up(url: str, path: str = "/health", timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}{path} did not come up in {timeout_s:g} s")


def start_engines(procs: Processes, count: int, options: list[str]) -> list[str]:
    urls = []
    for i in range(count):
        port = free_port()
        procs.start(
            f"engine-{port}",
            ["serve", "--runner", "null", "--port", str(port), "--engine-id", f"e{i}", *options],
        )
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_up(url)
    return urls


def start_router(
    procs: Processes, engines: list[str], placement: str, options: list[str] = ()
) -> str:
    """`junction route` for a routed placement (its policy, and its own options), with
    `options` (what every routed placement gets: `--finish-wait-s`)."""
    policy, own = ROUTED[placement]
    port = free_port()
    args = ["route", "--port", str(port), "--policy", policy, "--seed", "0", *own, *options]
    for url in engines:
        args += ["--engine", url]
    procs.start(f"router-{policy}{'-'.join(['', *own])}", args)
    url = f"http://127.0.0.1:{port}"
    wait_up(url)
    return url


class Burner:
    """`count` processes spinning on the CPU while it is open: a busy machine's other work."""

    SPIN = "while True:\n    pass"

    def __init__(self, count: int) -> None:
        self.count = count
        self.children: list[subprocess.Popen] = []

    def __enter__(self) -> Burner:
        self.children = [
            subprocess.Popen([sys.executable, "-c", self.SPIN]) for _ in range(self.count)
        ]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for child in self.children:
            child.kill()
        for child in self.children:
            child.wait()
        self.children = []


# ---------------------------------------------------------------------- a run
@dataclass
class RunResult:
    hit_tokens: int
    engines: list[str]  # where each request went, in trace order
    route_s: list[float]
    agreement: float | None
    decisions: list[dict]  # the router's, oldest first (none without a router)
    loaded_bytes: int = 0  # read from the engines' tiers during the trace (not its warm-up)
    latency_s: list[float] = field(default_factory=list)  # each request's, as its client saw
    wall_s: float = 0.0  # the trace's, from its first request to its last answer


async def loaded_bytes(engines: list[str], client: httpx.AsyncClient) -> int:
    """The bytes the engines' tiers have loaded so far (`/metrics`)."""
    total = 0
    for url in engines:
        text = (await client.get(url + "/metrics")).text
        for line in text.splitlines():
            if line.startswith("junction_tier_loaded_bytes_total "):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


async def send_all(
    prompts: list[Prompt],
    target,
    concurrency: int,
    client: httpx.AsyncClient,
    sessions: bool = False,
) -> tuple[list[int], list[str], list[float]]:
    """Each prompt as a completion with its system prompt's end as a message checkpoint (what a
    chat request sends); `target(prompt)` gives the base URL. `concurrency` prompts at a time,
    or with `sessions`, families: each family's prompts one after the other. Cached tokens,
    engines and seconds from sending to the whole answer, in order."""
    hits, engines = [0] * len(prompts), [""] * len(prompts)
    latency = [0.0] * len(prompts)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, prompt: Prompt) -> None:
        body = {"model": MODEL, "prompt": prompt.token_ids, "max_tokens": 4}
        if prompt.system_len:
            body["checkpoint_offsets"] = [prompt.system_len]
        base = target(prompt)
        sent = time.perf_counter()
        response = await client.post(base + "/v1/completions", json=body)
        latency[i] = time.perf_counter() - sent
        response.raise_for_status()
        usage = response.json()["usage"]
        hits[i] = usage["prompt_tokens_details"]["cached_tokens"]
        engines[i] = response.headers.get("x-junction-engine", base)

    async def gated(indices: list[int]) -> None:
        async with gate:
            for i in indices:
                await one(i, prompts[i])

    groups: dict[object, list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(prompt.family if sessions else i, []).append(i)
    await asyncio.gather(*(gated(indices) for indices in groups.values()))
    return hits, engines, latency


def run(
    trace: Trace,
    placement: str,
    num_engines: int,
    log_dir: Path,
    burners: int = 0,
    lag: Lag = Lag(),
) -> RunResult:
    """One placement on fresh engines, beside `burners` spinning processes (none: idle),
    with `lag`'s feed delay and router options."""
    with Burner(burners):
        return _run(trace, placement, num_engines, log_dir, lag)


def _run(trace: Trace, placement: str, num_engines: int, log_dir: Path, lag: Lag) -> RunResult:
    procs = Processes(log_dir)
    delays: list[FeedDelay] = []
    try:
        options = trace.one_engine_options if placement == "one engine" else trace.engine_options
        engines = start_engines(procs, 1 if placement == "one engine" else num_engines, options)
        if lag.feed_delay_s > 0:  # every placement reaches the engines through the proxies
            delays = [FeedDelay(int(url.rsplit(":", 1)[1]), lag.feed_delay_s) for url in engines]
            engines = [delay.url for delay in delays]
        router = None
        if placement in ROUTED:
            router = start_router(procs, engines, placement, lag.router_options)

        def target(prompt: Prompt) -> str:
            if router is not None:
                return router
            return engines[prompt.family % len(engines)]

        async def drive() -> tuple[
            list[int], list[str], list[float], float, dict | None, dict | None, int
        ]:
            async with httpx.AsyncClient(timeout=120) as client:
                if trace.warmup:  # the plain balancer's traffic before
                    await send_all(
                        trace.warmup, lambda p: engines[p.slot % len(engines)], 1, client
                    )
                before = await loaded_bytes(engines, client)
                started = time.perf_counter()
                hits, where, latency = await send_all(
                    trace.prompts, target, trace.concurrency, client, trace.sessions
                )
                wall_s = time.perf_counter() - started
                moved = await loaded_bytes(engines, client) - before
                fleet = decisions = None
                if router is not None:
                    headers = {"Authorization": f"Bearer {TOKEN}"}
                    fleet = (await client.get(router + "/fleet", headers=headers)).json()
                    decisions = (
                        await client.get(router + "/fleet/decisions?limit=1000", headers=headers)
                    ).json()
                return hits, where, latency, wall_s, fleet, decisions, moved

        hits, where, latency, wall_s, fleet, decisions, moved = asyncio.run(drive())
        route_s = [d["route_s"] for d in decisions["decisions"]] if decisions else []
        agreement = fleet["agreement"] if fleet else None
        oldest_first = list(reversed(decisions["decisions"])) if decisions else []
        return RunResult(sum(hits), where, route_s, agreement, oldest_first, moved, latency, wall_s)
    finally:
        procs.stop()
        for delay in delays:
            delay.close()


def spread(engines: list[str]) -> tuple[float, float]:
    counts = Counter(engines)
    values = list(counts.values())
    mean = sum(values) / len(values)
    return max(values) / mean, max(values) / max(min(values), 1)


# ---------------------------------------------------------------------- the router alone
def scale(num_engines: int = 8, num_keys: int = 100_000, num_requests: int = 1000) -> list[float]:
    """Routing time per request with `num_engines` engines whose indexes hold `num_keys` keys
    in all: hashing, scoring every engine, choosing (in-process, no HTTP)."""
    from engine.cache.lookup import HitGeometry
    from engine.feed import FeedLoad, FeedSnapshot
    from engine.hashing import hash_prefix
    from router.caches.index import EngineIndex
    from router.engines import FleetEngine
    from router.fleet import Fleet
    from router.policies import make_policy

    geometry = HitGeometry(UNIT, 16, UNIT, 0, True, True)
    rng = random.Random(7)
    systems = [segment_tokens(9000 + f, rng.randint(1000, 5000)) for f in range(64)]
    engines = []
    per_engine = num_keys // num_engines
    for i in range(num_engines):
        keys: list[bytes] = []
        while len(keys) < per_engine:
            keys.extend(hash_prefix(systems[rng.randrange(64)] + [i, len(keys)], UNIT))
        engine = FleetEngine(f"http://engine-{i}")
        engine.index = EngineIndex(geometry)
        load = FeedLoad(0, 0, 0, 0.0, 0.0)
        engine.index.apply_snapshot(
            FeedSnapshot(0, keys[:per_engine], keys[: per_engine // 4], load)
        )
        engine.status = "up"
        engines.append(engine)
    for engine in engines:
        engine.hello = _hello(engine.url, geometry)
    fleet = Fleet(engines, make_policy("hybrid"))
    times = []
    for n in range(num_requests):
        prompt = systems[rng.randrange(64)] + segment_tokens(20_000 + n, 128)
        started = time.perf_counter()
        decision = fleet.route(prompt, MODEL)
        times.append(time.perf_counter() - started)
        fleet.finish(decision, None)
    return times


def _hello(url: str, geometry):
    from engine.feed import FeedHello

    return FeedHello(url, 0, geometry, MODEL, 1 << 20)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def oracle_tokens(prompts: list[Prompt]) -> int:
    items = [
        TraceRequest(i, f"r{i}", p.token_ids, 4, None, 0.0, 1.0, None)
        for i, p in enumerate(prompts)
    ]
    return oracle(items, UNIT).num_oracle_tokens


#: The placements `junction route` makes: each one's policy and options of its own. "hybrid
#: (no expectations)" scores by the feeds' indexes alone (`--no-expectations`): beside hybrid
#: with a `--finish-wait-s` the feed lags past, it shows what the expectations keep (issue 50).
ROUTED: dict[str, tuple[str, list[str]]] = {
    **{
        policy: (policy, [])
        for policy in ("round_robin", "random", "attention", "hybrid_device", "lmetric", "hybrid")
    },
    "hybrid (no expectations)": ("hybrid", ["--no-expectations"]),
}
PLACEMENTS = (*ROUTED, "family affinity", "one engine")
DEFAULT_PLACEMENTS = tuple(p for p in PLACEMENTS if p != "hybrid (no expectations)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--traces", default="families,scarce,uniform,tiers")
    parser.add_argument(
        "--placements",
        default=",".join(DEFAULT_PLACEMENTS),
        help=f"a comma-separated subset to run (of {', '.join(PLACEMENTS)}; default all but "
        "hybrid (no expectations))",
    )
    parser.add_argument(
        "--busy", action="store_true", help="run every trace idle, then beside a CPU burner"
    )
    parser.add_argument(
        "--burners", type=int, default=os.cpu_count() or 1, help="spinning processes (--busy)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=None, help="requests in flight (default: the trace's)"
    )
    parser.add_argument(
        "--finish-wait-s",
        type=float,
        default=None,
        help="every routed placement's `junction route --finish-wait-s` (default: the router's)",
    )
    parser.add_argument(
        "--feed-delay-s",
        type=float,
        default=0.0,
        help="hold each engine's cache feed back this long on its way to the router (a feed "
        "that lags, as on a loaded machine; default 0)",
    )
    parser.add_argument("--skip-scale", action="store_true")
    args = parser.parse_args()
    args.placements = args.placements.split(",")
    unknown = [p for p in args.placements if p not in PLACEMENTS]
    if unknown:
        parser.error(f"--placements: unknown {unknown}; choose from {', '.join(PLACEMENTS)}")
    if args.burners < 1:
        parser.error(f"--burners must be at least 1, got {args.burners}")
    if args.finish_wait_s is not None and not args.finish_wait_s >= 0:
        parser.error(f"--finish-wait-s must be >= 0, got {args.finish_wait_s}")
    if not 0 <= args.feed_delay_s < 1.5:  # the router takes a feed silent 1.5 s for down
        parser.error(f"--feed-delay-s must be in [0, 1.5), got {args.feed_delay_s}")
    return args


def main() -> int:
    args = parse_args()
    builders = {
        "families": families_trace,
        "scarce": scarce_trace,
        "uniform": uniform_trace,
        "tiers": tiers_trace,
        "chats": chats_trace,
    }
    lag = Lag(args.finish_wait_s, args.feed_delay_s)
    conditions = {"idle": 0, f"busy ({args.burners} burners)": args.burners}
    if not args.busy:
        conditions = {"idle": 0}
    summary: dict[tuple[str, str], dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="junction-fleet-") as logs:
        for name in args.traces.split(","):
            trace = builders[name](args.seed, args.engines)
            if args.concurrency is not None:
                trace = dataclasses.replace(trace, concurrency=args.concurrency)
            for condition, burners in conditions.items():
                summary[name, condition] = report(
                    trace, args.engines, Path(logs), args.placements, condition, burners,
                    lag,
                )  # fmt: skip
    if args.busy:
        print_ratios(summary)
    if not args.skip_scale:
        times = scale()
        print(
            f"\nrouting, 8 engines, 100k indexed keys, in-process: p50 "
            f"{percentile(times, 0.5) * 1e3:.3f} ms, p99 {percentile(times, 0.99) * 1e3:.3f} ms"
        )
    return 0


def print_ratios(summary: dict[tuple[str, str], dict[str, int]]) -> None:
    """Hybrid's hit tokens over family affinity's and attention-only's, per trace and
    condition (issue 50's goal: >= 0.98x affinity on families, >= attention everywhere), and
    hybrid without expectations over family affinity where it ran."""
    print(
        f"\n  {'trace':<10} {'condition':<22} {'hybrid/affinity':>15} {'hybrid/attention':>16} "
        f"{'no expectations/affinity':>24}"
    )
    for (trace, condition), hits in summary.items():
        cells = []
        for mine, other in (
            ("hybrid", "family affinity"),
            ("hybrid", "attention"),
            ("hybrid (no expectations)", "family affinity"),
        ):
            ours = hits.get(mine)
            cells.append(f"{ours / hits[other]:.3f}x" if ours and hits.get(other) else "-")
        print(f"  {trace:<10} {condition:<22} {cells[0]:>15} {cells[1]:>16} {cells[2]:>24}")


def report(
    trace: Trace,
    num_engines: int,
    log_dir: Path,
    placements: list[str],
    condition: str = "idle",
    burners: int = 0,
    lag: Lag = Lag(),
) -> dict[str, int]:
    """Run every placement on `trace` beside `burners` spinning processes, with `lag`, and
    print its table; the hit tokens by placement."""
    best = oracle_tokens(trace.warmup + trace.prompts) - oracle_tokens(trace.warmup)
    total = sum(len(p.token_ids) for p in trace.prompts)
    prefill_rate, host_rate = trace.rates
    print(
        f"\n{trace.name}, {condition}: {len(trace.prompts)} requests, {total} prompt tokens, "
        f"oracle {best} hit tokens, {num_engines} engines ({' '.join(trace.engine_options)}), "
        f"{trace.concurrency} in flight; seconds at {prefill_rate:,.0f} prefill tokens/s and "
        f"{host_rate / 1e9:g} GB/s from host; {lag}"
    )
    results = {}
    for placement in placements:
        started = time.monotonic()
        results[placement] = run(trace, placement, num_engines, log_dir, burners, lag)
        print(f"  ran {placement} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    seconds = print_table(results, best, total, trace.rates)
    return print_notes(results, seconds)


def print_table(
    results: dict[str, RunResult], best: int, total: int, rates: tuple[float, float]
) -> dict[str, float]:
    """One row a placement: hits, prefill seconds, spread, routing time, agreement, and the
    client's latency (each request's p50 / p99, and the trace's wall seconds); the prefill
    seconds by placement."""
    prefill_rate, host_rate = rates
    one = results["one engine"].hit_tokens if "one engine" in results else 0
    affinity = results["family affinity"].hit_tokens if "family affinity" in results else 0
    width = max(16, *(len(placement) for placement in results))
    print(
        f"  {'placement':<{width}} {'hit tokens':>10} {'% oracle':>8} {'vs 1 engine':>11} "
        f"{'vs affinity':>11} {'load s':>7} {'prefill s':>9} {'busiest/mean':>12} "
        f"{'max/min':>7} {'route p50/p99 ms':>16} {'agree':>6} {'latency p50/p99 ms':>18} "
        f"{'wall s':>7}"
    )
    seconds = {}
    for placement, result in results.items():
        busiest, ratio = spread(result.engines) if placement != "one engine" else (1.0, 1.0)
        p50, p99 = (percentile(result.route_s, q) * 1e3 for q in (0.5, 0.99))
        timing = f"{p50:.2f}/{p99:.2f}" if result.route_s else "-"
        l50, l99 = (percentile(result.latency_s, q) * 1e3 for q in (0.5, 0.99))
        agree = f"{result.agreement:.1%}" if result.agreement is not None else "-"
        load_s = result.loaded_bytes / host_rate
        seconds[placement] = (total - result.hit_tokens) / prefill_rate + load_s
        print(
            f"  {placement:<{width}} {result.hit_tokens:>10} "
            f"{result.hit_tokens / max(best, 1):>8.1%} "
            f"{result.hit_tokens / one if one else 0:>11.2f} "
            f"{result.hit_tokens / affinity if affinity else 0:>11.2f} {load_s:>7.3f} "
            f"{seconds[placement]:>9.2f} {busiest:>12.2f} "
            f"{ratio:>7.2f} {timing:>16} {agree:>6} {f'{l50:.1f}/{l99:.1f}':>18} "
            f"{result.wall_s:>7.2f}"
        )
    return seconds


def print_notes(results: dict[str, RunResult], seconds: dict[str, float]) -> dict[str, int]:
    """What the rows mean together: requests scored on an expectation, and hybrid over the
    placements it is measured against; the hit tokens by placement."""
    hits = {p: r.hit_tokens for p, r in results.items()}
    for placement, result in results.items():
        chosen = [s for d in result.decisions for s in d["scores"] if s["url"] == d["url"]]
        if any(s.get("expected") for s in chosen):  # a router that keeps what it sent
            counted = sum(s.get("expected", 0) > 0 for s in chosen)
            print(
                f"  {placement}: {counted} requests scored on a finish its feed had not confirmed"
            )
    if hits.get("attention"):
        print(f"  hybrid / attention-only: {hits.get('hybrid', 0) / hits['attention']:.2f}x")
    if hits.get("hybrid (no expectations)") and "hybrid" in hits:
        print(
            f"  hybrid / hybrid (no expectations): "
            f"{hits['hybrid'] / hits['hybrid (no expectations)']:.3f}x hit tokens"
        )
    if hits.get("hybrid_device"):
        print(
            f"  hybrid (tiers) / hybrid (device alone): "
            f"{hits.get('hybrid', 0) / hits['hybrid_device']:.2f}x "
            f"hit tokens, prefill s {seconds.get('hybrid', 0):.2f} against "
            f"{seconds['hybrid_device']:.2f}"
        )
    if hits.get("lmetric") and "hybrid" in hits:
        print(
            f"  hybrid / lmetric: {hits['hybrid'] / hits['lmetric']:.2f}x hit tokens, prefill s "
            f"{seconds['hybrid']:.2f} against {seconds['lmetric']:.2f}"
        )
    return hits


if __name__ == "__main__":
    sys.exit(main())
