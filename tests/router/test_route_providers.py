"""The providers' caching APIs through `junction route` over three real `junction serve --runner
ledger` engines, driven by Anthropic's and OpenAI's own Python SDKs (issue 51): a Messages
request's breakpoint is read back in full by the next one through the router, which predicted
that hit; a streamed message equals the whole one; and `prompt_cache_key` keeps a key's
requests on one engine where the policy alone would spread them, until a pile of the key's
long requests makes that engine too busy and the key moves, which the decision says.

The engines run the default geometry: attention blocks of 16 tokens (the match unit U), Mamba
blocks of 512, so without a breakpoint a prefix of 300 tokens leaves no hit at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import pytest

from engine.model.tokenizer import render_message
from router.affinity import DEFAULT_SPILL_S, KEPT, SPILLED
from tests.router.processes import AUTH, MODEL, Process, running, start_engine, start_router
from tests.serve.conftest import text_prompt

UNIT = 16
EPHEMERAL = {"type": "ephemeral"}
HEADER = "You are a helpful assistant. Answer briefly.\n"  # every key's requests begin so
SPILL_PROMPT_TOKENS = 2000  # each of the pile's prompts: new work, 0.1 s of predicted prefill
SPILL_OUTPUT_TOKENS = 6000  # seconds of decoding on the ledger runner: the pile overlaps
NUM_PILED = 16  # more than the margin's worth (0.5 s) of such requests on one engine


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Process]]:
    log_dir = tmp_path_factory.mktemp("route-providers")
    started = [
        start_engine(log_dir, name, "--num-blocks", "1024", runner="ledger")
        for name in ("p0", "p1", "p2")
    ]
    with running(*started) as ready:
        yield ready


@pytest.fixture(scope="module")
def router(engines: list[Process], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    log_dir = tmp_path_factory.mktemp("route-providers-router")
    with running(start_router(log_dir, engines)) as (started,):
        yield started


@pytest.fixture
def claude(router: Process) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=router.url, api_key="x", max_retries=0)


def decision(router: Process, route_id: str) -> dict:
    response = httpx.get(f"{router.url}/fleet/decisions/{route_id}", headers=AUTH, timeout=5)
    response.raise_for_status()
    return response.json()


def turn(shared: str, rest: str) -> list[dict]:
    """A user turn of two blocks, the first (shared by the family) marked as a breakpoint."""
    first = {"type": "text", "text": shared, "cache_control": EPHEMERAL}
    return [{"role": "user", "content": [first, {"type": "text", "text": rest}]}]


def test_a_second_message_reads_its_breakpoint_through_the_router(claude, router) -> None:
    shared = text_prompt(701, 300)
    breakpoint_at = len(render_message({"role": "user", "content": ""})) - 1 + len(shared)
    on_grid = breakpoint_at // UNIT * UNIT
    assert on_grid % 512  # no Mamba block ends there: only the breakpoint's state serves it
    first = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=2, messages=turn(shared, text_prompt(702, 100))
    )
    assert first.parse().usage.cache_creation_input_tokens == on_grid
    second = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=2, messages=turn(shared, "!" + text_prompt(703, 99))
    )
    assert second.headers["x-junction-engine"] == first.headers["x-junction-engine"]
    assert second.parse().usage.cache_read_input_tokens == on_grid
    routed = decision(router, second.headers["x-junction-route-id"])
    assert (routed["reason"], routed["predicted_hit"], routed["realised_hit"]) == (
        "hit",
        on_grid,
        on_grid,
    )


def test_a_streamed_message_through_the_router_equals_the_whole_one(claude, router) -> None:
    system = [{"type": "text", "text": text_prompt(707, 300), "cache_control": EPHEMERAL}]
    messages = [{"role": "user", "content": text_prompt(708, 50)}]
    greedy = {"temperature": 0}  # not in this SDK's signature; Anthropic's API takes it
    whole = claude.messages.create(
        model=MODEL, max_tokens=8, system=system, messages=messages, extra_body=greedy
    )
    with claude.messages.stream(
        model=MODEL, max_tokens=8, system=system, messages=messages, extra_body=greedy
    ) as stream:
        streamed = stream.get_final_message()
        route_id = stream.response.headers["x-junction-route-id"]
    assert streamed.content[0].text == whole.content[0].text
    assert streamed.stop_reason == whole.stop_reason == "max_tokens"
    assert streamed.usage.output_tokens == 8
    read = streamed.usage.cache_read_input_tokens
    assert read > 0  # the whole one left the system prompt's breakpoint
    routed = decision(router, route_id)
    assert routed["status"] == "finished" and routed["realised_hit"] == read


def test_a_diagnosis_asked_of_the_router_comes_from_the_engine(claude, router) -> None:
    """The router folds `X-Junction-Diagnose: 1` into the body's `junction.diagnose`, which the
    engine answers; the body's own way goes through as it is."""
    shared = text_prompt(711, 300)
    claude.messages.create(model=MODEL, max_tokens=1, messages=turn(shared, text_prompt(712, 50)))
    raw = claude.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=1,
        messages=turn(shared, "?" + text_prompt(713, 49)),
        extra_headers={"X-Junction-Diagnose": "1"},
    )
    body = raw.http_response.json()
    diagnosis = body["junction"]["diagnosis"]
    assert body["usage"]["cache_read_input_tokens"] > 0
    assert diagnosis["hit_stopped_at"] == body["usage"]["cache_read_input_tokens"]
    raw = router.client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": text_prompt(714, 200)}],
        max_tokens=1,
        extra_body={"junction": {"diagnose": True}},
    )
    diagnosis = raw.http_response.json()["junction"]["diagnosis"]
    assert diagnosis["hit_stopped_at"] == 0 and diagnosis["diverged_at"] == 0  # a new prompt
    plain = router.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": text_prompt(715, 50)}], max_tokens=1
    )
    assert "junction" not in plain.http_response.json()  # asked for only


def ask(router: Process, key: str | None, seed: int, max_tokens: int = 1) -> dict:
    """One chat request of `key` (the same header, then a question no other request shares),
    by OpenAI's SDK; its decision."""
    question = text_prompt(seed, 600)
    raw = router.client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "system", "content": HEADER}, {"role": "user", "content": question}],
        max_tokens=max_tokens,
        extra_body={} if key is None else {"prompt_cache_key": key},
    )
    return decision(router, raw.headers["x-junction-route-id"])


def ask_anthropic(claude: anthropic.Anthropic, router: Process, key: str, seed: int) -> dict:
    raw = claude.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=1,
        system=HEADER,
        messages=[{"role": "user", "content": text_prompt(seed, 600)}],
        extra_body={"prompt_cache_key": key},
    )
    return decision(router, raw.headers["x-junction-route-id"])


def test_a_cache_key_keeps_its_requests_on_one_engine(claude, router) -> None:
    """The requests share only a header (under `--min-hit-share` of each prompt), so the policy
    sends them where the load is least: without keys one sender's requests go round the
    engines; with a key each sender's stay on the engine its first went to."""
    without = [ask(router, None, 900 + i) for i in range(6)]
    assert len({d["url"] for d in without[0::2]}) > 1  # every other one: a sender of two
    keys = ["tenant-a", "tenant-b", "tenant-c"]  # with "tenant-m": 4 a round, on 3 engines
    homes: dict[str, str] = {}
    for i in range(4):
        for k, key in enumerate(keys):
            routed = ask(router, key, 910 + 10 * i + k)
            homes.setdefault(key, routed["url"])
            assert routed["url"] == homes[key], f"{key} moved on its request {i}"
            assert routed["cache_key"] == key and (i == 0 or routed["reason"] == KEPT)
        messages_key = ask_anthropic(claude, router, "tenant-m", 950 + i)
        homes.setdefault("tenant-m", messages_key["url"])
        assert messages_key["url"] == homes["tenant-m"]


def test_a_pile_of_long_requests_spills_a_key_and_says_so(router) -> None:
    """The key's engine takes its long requests until their queue there is more than the
    margin over another engine's; the next goes to that engine, the decision says
    `cache_key_spill` from the old home, and the key's requests follow it afterwards."""
    home = ask(router, "agent-9", 1000)["url"]
    client = router.client

    def long_request(seed: int) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": text_prompt(seed, SPILL_PROMPT_TOKENS)}],
            max_tokens=SPILL_OUTPUT_TOKENS,
            extra_body={"prompt_cache_key": "agent-9"},
        )
        return raw.headers["x-junction-route-id"]

    with ThreadPoolExecutor(NUM_PILED) as pool:
        route_ids = list(pool.map(long_request, range(1001, 1001 + NUM_PILED)))
    piled = sorted((decision(router, r) for r in route_ids), key=lambda d: d["ts"])
    spills = [d for d in piled if d["reason"] == SPILLED]
    assert spills, [(d["url"], d["reason"]) for d in piled]
    first = spills[0]
    assert first["cache_key_home"] == home and first["url"] != home
    seconds = {score["url"]: score["predicted_s"] for score in first["scores"]}
    assert seconds[home] - seconds[first["url"]] > DEFAULT_SPILL_S
    assert all(d["url"] == home for d in piled[: piled.index(first)])
    after = ask(router, "agent-9", 1100)
    assert after["url"] == piled[-1]["url"] and after["reason"] == KEPT
