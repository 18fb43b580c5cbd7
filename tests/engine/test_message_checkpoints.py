"""Message checkpoints (docs/rules.md section 5): a chat request keeps the state where each of its
rendered messages ends, so a family's first request already leaves what its siblings hit."""

from __future__ import annotations

import json

import pytest

from bench import BenchmarkSpec, run_benchmark
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.model.tokenizer import ByteTokenizer, message_ends, render_chat
from engine.request import SamplingParams
from engine.traces.trace import TraceError, parse_line
from workloads import build_workload, oracle

SYSTEM = "You are a careful assistant. Answer briefly. " * 22  # 990 characters


def chat(question: str, system: str = SYSTEM) -> tuple[list[int], list[int]]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return ByteTokenizer().encode(render_chat(messages)), message_ends(messages)


def engine(**cache) -> Engine:
    config = {"block_size": 16, "mamba_block_size": 512, "num_blocks": 2048, **cache}
    return Engine(CacheConfig(**config), SchedulerConfig(), runner="ledger")


def run(e: Engine, prompt: tuple[list[int], list[int]]):
    token_ids, offsets = prompt
    request = e.add_request(token_ids, SamplingParams(max_tokens=2), checkpoint_offsets=offsets)
    e.run_until_done()
    e.check_invariants()
    return request


def test_message_ends_count_the_rendered_bytes_without_the_open_header():
    token_ids, ends = chat("hi")
    system_end = len(f"<|system|>\n{SYSTEM}\n")
    assert ends == [system_end, system_end + len("<|user|>\nhi\n")]
    assert len(token_ids) == ends[-1] + len("<|assistant|>\n")


@pytest.mark.parametrize("mode", ["inline", "stops"])
def test_the_first_chat_request_leaves_the_system_prompt_state_the_second_hits(mode):
    e = engine(checkpoint_mode=mode)
    unit = e.cache_config.match_unit
    first = run(e, chat("What is the capital of France?"))
    system_end = first.checkpoint_offsets[0]
    boundary = system_end // unit * unit
    assert boundary % 512 and boundary in first.checkpoints
    if mode == "stops":
        assert "message" in first.chunk_stop_reasons
    second = run(e, chat("Why is the sky blue?"))
    assert second.num_cached_tokens == boundary
    assert second.hit_tokens_by_group["mamba"] == boundary


@pytest.mark.parametrize(("interval", "hit"), [(0, 512), (64, 960), (None, 960), (128, 896)])
def test_without_offsets_the_first_request_leaves_the_block_or_interval_floor(interval, hit):
    """The system prompt ends at 1001: with no offsets the second request finds the state at the
    block floor (512), or at the interval floor when interval states are on (the default, 64)."""
    e = engine(checkpoint_interval=interval)
    first = run(e, (chat("What is the capital of France?")[0], []))
    second = run(e, (chat("Why is the sky blue?")[0], []))
    assert second.num_cached_tokens == hit  # the junction is only materialized now
    assert (960 in first.checkpoints) == (hit == 960)


def test_with_partial_hits_off_messages_floor_to_the_scheduler_block():
    e = engine(partial_hits=False, checkpoint_mode="stops")
    system = "x" * 1600
    first = run(e, chat("first question " * 40, system))
    assert first.checkpoint_offsets[0] == 1612
    assert 1536 in first.checkpoints and "message" in first.chunk_stop_reasons
    second = run(e, chat("second question " * 40, system))
    assert second.num_cached_tokens == 1536


def test_offsets_outside_the_prompt_are_refused():
    e = engine()
    with pytest.raises(ValueError, match=r"checkpoint_offsets must lie in \(0, 3\]"):
        e.add_request([1, 2, 3], checkpoint_offsets=[4])


# ------------------------------------------------------------------ trace lines
def test_trace_lines_carry_checkpoint_offsets():
    line = {"id": "a", "prompt_token_ids": [1, 2, 3, 4], "checkpoint_offsets": [2, 4]}
    item = parse_line(json.dumps(line), 1)
    assert item.checkpoint_offsets == (2, 4)
    segments = {"prompt": {"segments": [{"seed": 1, "len": 600}]}, "checkpoint_offsets": [560]}
    assert parse_line(json.dumps(segments), 2, expand=False).checkpoint_offsets == (560,)


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ([5], r"line 3: checkpoint_offsets: must lie in \(0, 4\]"),
        ([0], r"line 3: checkpoint_offsets\.0: Input should be greater than 0"),
        (["x"], r"line 3: checkpoint_offsets\.0: Input should be a valid integer"),
        (7, r"line 3: checkpoint_offsets: Input should be a valid list"),
    ],
)
def test_bad_checkpoint_offsets_name_the_line_and_field(offsets, message):
    line = {"prompt": "abcd", "checkpoint_offsets": offsets}
    with pytest.raises(TraceError, match=message):
        parse_line(json.dumps(line), 3)


# ------------------------------------------------------------------ chat workloads
@pytest.mark.parametrize(
    "params",
    [
        {"kind": "chat_shared_prefix", "num_groups": 2, "prompts_per_group": 3},
        {"kind": "chat_multi_turn", "num_users": 2, "num_rounds": 2},
        {"kind": "chat_agentic", "num_sessions": 2, "num_steps": 2},
    ],
)
def test_chat_workloads_render_messages_with_their_offsets(params):
    workload = build_workload({**params, "system_prompt_len": 700})
    assert not workload.pins and set(workload.messages) == {r["id"] for r in workload.requests}
    for line in workload.requests:
        messages = workload.messages[line["id"]]
        assert messages[0]["role"] == "system" and len(messages[0]["content"]) == 700
        assert line["prompt_token_ids"] == ByteTokenizer().encode(render_chat(messages))
        assert line["checkpoint_offsets"] == message_ends(messages)
    assert workload.num_prompt_tokens == sum(len(r["prompt_token_ids"]) for r in workload.requests)
    hits = oracle(workload.items(), 16).hits
    assert max(h.num_oracle_tokens for h in hits) >= 704  # the system message, floored to U


def test_a_chat_familys_second_request_hits_the_whole_system_prompt_in_process():
    spec = BenchmarkSpec.model_validate(
        {
            "name": "chat",
            "workload": {
                "kind": "chat_shared_prefix",
                "num_groups": 2,
                "prompts_per_group": 2,
                "system_prompt_len": 1000,
                "question_len": 64,
                "output_len": 2,
                "shuffle": False,
            },
            "modes": ["junction_inline"],
            "geometry": {"block_size": 16, "mamba_block_size": 512, "num_blocks": 1024},
            "concurrency": 1,
        }
    )
    workload = spec.workload.build()
    system_end = workload.requests[0]["checkpoint_offsets"][0]
    (row,) = run_benchmark(spec)["modes"]
    # each group: the first request hits nothing, the second the whole system message
    assert row["num_cached_tokens"] == 2 * (system_end // 16 * 16)
    assert row["hit_rate"] == row["oracle_hit_rate"]
