"""`AsyncEngine` driven directly from asyncio: outputs, records, refusals, aborts, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from engine.engine import Engine
from engine.model.tokenizer import EOS_ID
from engine.request import SamplingParams
from engine.runners.null import NullRunner
from serve.async_engine import AsyncEngine
from serve.request_stream import EngineDeadError, FinishedRequest, RequestRejected
from tests.engine.conftest import tokens
from tests.polling import wait_until
from tests.serve.conftest import MAX_MODEL_LEN, SlowRunner, small_engine

GREEDY = SamplingParams(max_tokens=8, stop_token_ids=(EOS_ID,))


@pytest.fixture
def async_engine() -> Iterator[AsyncEngine]:
    async_engine = AsyncEngine(small_engine())
    async_engine.start()
    yield async_engine
    async_engine.shutdown()


@pytest.fixture
def slow_engine() -> Iterator[AsyncEngine]:
    async_engine = AsyncEngine(small_engine(SlowRunner()))
    async_engine.start()
    yield async_engine
    async_engine.shutdown()


async def run_one(async_engine: AsyncEngine, prompt: list[int], sampling=GREEDY):
    stream = await async_engine.add_request(prompt, sampling)
    async with stream:
        return [output async for output in stream]


def test_tokens_stream_then_a_finish_record_matching_a_plain_engine_run(async_engine):
    prompt = tokens(1, 200)
    outputs = asyncio.run(run_one(async_engine, prompt))
    token_ids = [t for output in outputs for t in output.new_token_ids]
    assert all(o.finished is None for o in outputs[:-1])
    record = outputs[-1].finished
    assert record.finish_reason == "length"
    assert record.num_prompt_tokens == 200 and record.num_output_tokens == 8
    assert record.num_cached_tokens == 0
    assert record.ttft_s is not None and record.e2e_s >= record.ttft_s
    reference = small_engine().generate([prompt], GREEDY)[0]
    assert token_ids == reference.output_token_ids


def test_a_repeated_prompt_reports_its_hit(async_engine):
    prompt = tokens(2, 600)
    asyncio.run(run_one(async_engine, prompt))
    outputs = asyncio.run(run_one(async_engine, prompt))
    record = outputs[-1].finished
    assert record.num_cached_tokens > 0
    assert all(o.num_cached_tokens == record.num_cached_tokens for o in outputs)
    assert set(record.hit_tokens_by_group) == {"attention", "mamba"}
    assert record.hit_tokens_by_group["mamba"] == record.num_cached_tokens


def test_refusals_reach_the_caller_and_the_loop_goes_on(async_engine):
    with pytest.raises(RequestRejected, match="max_model_len"):
        asyncio.run(run_one(async_engine, tokens(3, MAX_MODEL_LEN + 1)))
    with pytest.raises(RequestRejected, match="empty prompt"):
        asyncio.run(run_one(async_engine, []))
    assert asyncio.run(run_one(async_engine, tokens(4, 50)))[-1].finished.finish_reason == "length"
    assert async_engine.is_running


def test_concurrent_requests_all_finish(async_engine):
    async def main():
        return await asyncio.gather(*(run_one(async_engine, tokens(10 + i, 300)) for i in range(8)))

    for outputs in asyncio.run(main()):
        assert sum(len(o.new_token_ids) for o in outputs) == 8
        assert outputs[-1].finished.finish_reason == "length"
    assert async_engine.num_in_flight == 0


def test_abort_finishes_the_request_with_its_reason(slow_engine):
    records: list[FinishedRequest] = []
    slow_engine.add_finish_listener(records.append)

    async def main():
        stream = await slow_engine.add_request(tokens(5, 100), SamplingParams(max_tokens=2000))
        first = await anext(stream)
        stream.abort(reason="stop")
        return first

    assert asyncio.run(main()).new_token_ids
    assert wait_until(lambda: records)
    assert records[0].finish_reason == "stop" and records[0].num_output_tokens < 2000
    assert slow_engine.num_in_flight == 0


def test_a_cancelled_consumer_aborts_its_request(slow_engine):
    records: list[FinishedRequest] = []
    slow_engine.add_finish_listener(records.append)

    async def main():
        task = asyncio.create_task(run_one(slow_engine, tokens(6, 100), SamplingParams(2000)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert wait_until(lambda: records)
    assert records[0].finish_reason == "abort"


def test_call_runs_on_the_engine_thread(async_engine):
    usage = asyncio.run(async_engine.call(Engine.cache_usage))
    assert set(usage) == {"attention", "mamba"} and usage["attention"].num_blocks == 512
    snapshot = asyncio.run(async_engine.call(Engine.snapshot))
    assert snapshot["engine_id"] == "engine-test"


def test_shutdown_fails_requests_in_flight_and_refuses_new_ones(slow_engine):
    async def main():
        stream = await slow_engine.add_request(tokens(7, 100), SamplingParams(max_tokens=2000))
        await anext(stream)
        await asyncio.to_thread(slow_engine.shutdown)
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError, match="shut down"):
            await slow_engine.add_request(tokens(8, 10), GREEDY)

    asyncio.run(main())
    assert not slow_engine.is_running
    slow_engine.shutdown()  # idempotent


class BrokenRunner(NullRunner):
    """A runner that fails in its forward pass, as a bug in a real model would."""

    def forward(self, chunks):
        raise RuntimeError("the forward pass broke")


def test_an_engine_crash_reaches_the_waiting_request():
    async_engine = AsyncEngine(small_engine(BrokenRunner(small_engine().model_config)))
    async_engine.start()
    with pytest.raises(EngineDeadError, match="forward pass broke"):
        asyncio.run(run_one(async_engine, tokens(9, 50)))
    assert not async_engine.is_running
    assert isinstance(async_engine.error, RuntimeError)
    async_engine.shutdown()


def test_a_request_before_start_is_refused():
    with pytest.raises(EngineDeadError, match="not been started"):
        asyncio.run(run_one(AsyncEngine(small_engine()), tokens(1, 10)))


def test_a_caller_cancelled_before_admission_starts_nothing(slow_engine):
    async def main():
        # the engine thread is busy stepping a long request, so the second waits in the queue
        busy = await slow_engine.add_request(tokens(11, 100), SamplingParams(max_tokens=2000))
        await anext(busy)
        task = asyncio.create_task(slow_engine.add_request(tokens(12, 100), GREEDY))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        busy.abort()

    asyncio.run(main())
    assert wait_until(lambda: slow_engine.num_in_flight == 0)
    assert asyncio.run(run_one(slow_engine, tokens(13, 20), SamplingParams(max_tokens=2)))
    assert slow_engine.is_running
