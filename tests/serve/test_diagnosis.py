"""The engine's diagnosis oracle (`serve.diagnosis`) on an in-process ledger engine: what it
answers, when (once every earlier arrival finished), and its bounds (unit and tier records,
waiters), and the 400 of a server built without one."""

from __future__ import annotations

import json
import random
from concurrent.futures import Future

import httpx
import pytest

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import BlockRemoved, BlockStored
from engine.feed import FeedHub
from engine.model.tokenizer import ByteTokenizer
from engine.request import SamplingParams
from serve.app import create_app
from serve.async_engine import AsyncEngine
from serve.diagnosis import DiagnosingSink, DiagnosisOracle
from tests.serve.conftest import MODEL, serve, small_engine
from tests.uvicorn_thread import uvicorn_thread


def engine_with(oracle: DiagnosisOracle) -> Engine:
    config = CacheConfig(block_size=16, mamba_block_size=512, prefix_match_unit=16)
    sink = DiagnosingSink(FeedHub(), False, oracle)
    engine = Engine(config, SchedulerConfig(), runner="ledger", sink=sink)
    oracle.attach(engine)
    return engine


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


def ask(engine: Engine, oracle: DiagnosisOracle, request_id: str, prompt: list[int]) -> Future:
    future = oracle.expect(request_id)
    engine.add_request(prompt, SamplingParams(max_tokens=4), request_id)
    return future


def test_a_resend_is_held_back_one_unit_with_its_remedy():
    oracle = DiagnosisOracle()
    engine = engine_with(oracle)
    prompt = tokens(random.Random(1), 640)
    first = ask(engine, oracle, "a", prompt)
    engine.run_until_done()
    second = ask(engine, oracle, "b", prompt)
    engine.run_until_done()
    assert first.result(0)["diverged_at"] == 0
    diagnosis = second.result(0)
    assert (diagnosis["hit_stopped_at"], diagnosis["diverged_at"]) == (624, 640)
    assert diagnosis["missed_tokens"]["held_back"] == 16 == sum(diagnosis["missed_tokens"].values())
    assert list(diagnosis["remedies"]) == ["held_back"]
    assert diagnosis["arrival_index"] == 1 and diagnosis["epoch"] == engine.epoch


def test_a_diagnosis_waits_for_every_earlier_arrival():
    oracle = DiagnosisOracle()
    engine = engine_with(oracle)
    rng = random.Random(2)
    system = tokens(rng, 600)
    engine.add_request(system + tokens(rng, 40), SamplingParams(max_tokens=200), "long")
    engine.step()
    late = ask(engine, oracle, "short", system + tokens(rng, 40))
    finished: set[str] = set()
    overtaken = False  # the later request finished while the earlier one still ran
    while engine.has_unfinished():
        finished |= {request.request_id for request in engine.step()}
        if "long" not in finished:
            overtaken |= "short" in finished
            assert not late.done()  # the earlier arrival still runs: its units are not all in
    assert overtaken and late.result(0)["diverged_at"] == 592


def test_the_unit_records_are_bounded_least_recently_seen_first_out():
    oracle = DiagnosisOracle(max_units=50)
    engine = engine_with(oracle)
    rng = random.Random(3)
    first = tokens(rng, 640)
    engine.add_request(first, SamplingParams(max_tokens=4), "first")
    engine.run_until_done()
    for index in range(3):  # 40 units each: the first prompt's go
        engine.add_request(tokens(rng, 640), SamplingParams(max_tokens=4), f"other{index}")
        engine.run_until_done()
        assert len(oracle.units) <= 50
    again = ask(engine, oracle, "again", first)
    engine.run_until_done()
    assert again.result(0)["diverged_at"] == 0  # forgotten, as a store past its cap would


def test_the_tier_records_are_bounded():
    oracle = DiagnosisOracle(max_units=4)
    engine_with(oracle)
    for index in range(10):
        key = f"{index:016x}" + "0" * 48
        oracle.tap(BlockStored([key], None, 16, 0, "attention", [], (0, 16), False, None, "host"))
        oracle.tap(BlockRemoved([key], 0, "attention", [], "host"))
    oracle.on_step(None)
    assert len(oracle.tiers) == 4 and oracle.saw_tiers
    assert all(r["host"].removed_ts is not None for r in oracle.tiers.values())


def test_the_waiters_are_bounded_and_a_given_up_waiter_is_skipped():
    oracle = DiagnosisOracle(max_waiting=2)
    engine = engine_with(oracle)
    rng = random.Random(4)
    futures = [ask(engine, oracle, f"r{i}", tokens(rng, 100)) for i in range(3)]
    assert futures[0].done() and futures[0].result(0) is None  # pushed out by later ones
    futures[1].cancel()  # its response gave up waiting
    engine.run_until_done()  # and the oracle does not trip on it
    assert futures[2].result(0) is not None
    assert not oracle.wanted and not oracle.waiting


def test_an_oracle_never_attached_keeps_nothing():
    oracle = DiagnosisOracle()
    future = oracle.expect("x")
    assert future.result(0) is None
    oracle.tap(BlockStored(["0" * 64], None, 16, 0, "attention", [], (0, 16), False, None, "host"))
    assert oracle.events == []


@pytest.fixture(scope="module")
def plain_server():
    yield from serve(small_engine())  # `create_app` without an oracle


def test_a_server_without_an_oracle_refuses_a_diagnosis_naming_the_field(plain_server):
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2, "junction": {"diagnose": True}}
    with plain_server.http() as http:
        refused = http.post("/v1/completions", json=body)
        by_header = http.post(
            "/v1/completions", json={**body, "junction": {}}, headers={"X-Junction-Diagnose": "1"}
        )
        plain = http.post("/v1/completions", json={**body, "junction": {"diagnose": False}})
    assert refused.status_code == 400 == by_header.status_code
    assert refused.json()["error"]["param"] == "junction.diagnose"
    assert plain.status_code == 200 and "junction" not in plain.json()


@pytest.fixture(scope="module")
def diagnosing_server():
    oracle = DiagnosisOracle()
    engine = engine_with(oracle)
    app = create_app(AsyncEngine(engine), MODEL, tokenizer=ByteTokenizer(), diagnosis=oracle)
    with uvicorn_thread(app, lifespan="on") as url:
        yield url


def events(http: httpx.Client, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json=body, headers={"X-Junction-Diagnose": "true"}) as answer:
        lines = [line for line in answer.iter_lines() if line.startswith("data: {")]
    return [json.loads(line.removeprefix("data: ")) for line in lines]


def test_a_stream_carries_the_diagnosis_on_its_last_data(diagnosing_server):
    text = "the same long system prompt, " * 30
    chat = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 3}
    chat |= {"stream": True, "stream_options": {"include_usage": True}}
    messages = {"model": MODEL, "max_tokens": 3, "stream": True}
    messages["messages"] = [{"role": "user", "content": text}]
    with httpx.Client(base_url=diagnosing_server, timeout=30) as http:
        chunks = events(http, "/v1/chat/completions", chat)
        sent = events(http, "/v1/messages", messages)
    assert "usage" in chunks[-1] and chunks[-1]["junction"]["diagnosis"]["arrival_index"] == 0
    assert all("junction" not in chunk for chunk in chunks[:-1])
    (delta,) = [event for event in sent if event["type"] == "message_delta"]
    diagnosis = delta["junction"]["diagnosis"]
    assert diagnosis["arrival_index"] == 1 and diagnosis["diverged_at"] > 0
    assert sent[-1]["type"] == "message_stop"
    assert [event for event in sent if "junction" in event] == [delta]
