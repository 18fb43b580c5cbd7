"""Every workload generator: prompt lengths, which prefixes requests share, pins, and the same
trace for the same seed."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from engine.traces.trace import TracePin, TraceRequest, parse_line
from workloads import WORKLOAD_KINDS, build_workload, parse_workload


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def requests(workload) -> dict[str, TraceRequest]:
    return {i.request_id: i for i in workload.items() if isinstance(i, TraceRequest)}


def test_generated_shared_prefix_groups_share_exactly_the_system_prompt():
    params = {
        "kind": "generated_shared_prefix",
        "num_groups": 3,
        "prompts_per_group": 4,
        "system_prompt_len": 100,
        "question_len": 30,
        "output_len": 7,
    }
    workload = build_workload(params)
    by_id = requests(workload)
    assert len(by_id) == 12 and workload.num_prompt_tokens == 12 * 130
    assert {len(r.token_ids) for r in by_id.values()} == {130}
    assert {r.max_tokens for r in by_id.values()} == {7}
    ids = list(by_id)
    assert ids != sorted(ids, key=lambda i: (int(i[1]), i))  # shuffled, as SGLang does
    for a in ids:
        for b in ids:
            if a == b:
                continue
            shared = common_prefix(by_id[a].token_ids, by_id[b].token_ids)
            if a.split("-")[0] == b.split("-")[0]:
                assert 100 <= shared < 110  # the system prompt, and a question apart
            else:
                assert shared < 10
    pins = [i for i in workload.items(with_pins=True) if isinstance(i, TracePin)]
    assert len(pins) == 3 and all(len(p.token_ids) == 100 for p in pins)
    systems = {tuple(r.token_ids[:100]) for r in by_id.values()}
    assert {tuple(p.token_ids) for p in pins} == systems
    unshuffled = build_workload({**params, "shuffle": False})
    assert [line["id"] for line in unshuffled.requests][:4] == [f"g0-q{q}" for q in range(4)]


def test_multi_turn_each_turn_extends_the_last_prompt_by_its_answer_and_a_question():
    params = {
        "kind": "multi_turn",
        "num_users": 3,
        "num_rounds": 3,
        "system_prompt_len": 50,
        "user_history_len": 40,
        "question_len": 10,
        "answer_len": 20,
    }
    by_id = requests(build_workload(params))
    assert list(by_id)[:4] == ["u0-r0", "u1-r0", "u2-r0", "u0-r1"]  # interleaved users
    for user in range(3):
        for round_ in range(3):
            prompt = by_id[f"u{user}-r{round_}"].token_ids
            assert len(prompt) == 50 + 40 + 10 + round_ * 30
            assert by_id[f"u{user}-r{round_}"].max_tokens == 20
            if round_:
                previous = by_id[f"u{user}-r{round_ - 1}"].token_ids
                assert prompt[: len(previous)] == previous
                answer = prompt[len(previous) : len(previous) + 20]
                assert answer != [0] * 20  # a modelled answer, not padding
    a, b = by_id["u0-r0"].token_ids, by_id["u1-r0"].token_ids
    assert 50 <= common_prefix(a, b) < 60  # users share only the system prompt
    sequential = build_workload({**params, "interleave": False})
    assert [line["id"] for line in sequential.requests][:3] == ["u0-r0", "u0-r1", "u0-r2"]


def test_prefix_repetition_uses_every_prefix_evenly():
    workload = build_workload(
        {
            "kind": "prefix_repetition",
            "num_prefixes": 4,
            "prefix_len": 64,
            "suffix_len": 32,
            "num_prompts": 20,
            "output_len": 5,
        }
    )
    by_id = requests(workload)
    assert len(by_id) == 20 and {len(r.token_ids) for r in by_id.values()} == {96}
    prefixes: dict[tuple, int] = {}
    for r in by_id.values():
        prefixes[tuple(r.token_ids[:64])] = prefixes.get(tuple(r.token_ids[:64]), 0) + 1
    assert sorted(prefixes.values()) == [5, 5, 5, 5]
    suffixes = {tuple(r.token_ids[64:]) for r in by_id.values()}
    assert len(suffixes) == 20
    assert len(workload.pins) == 4


def test_agentic_context_grows_by_an_action_and_a_tool_output_each_step():
    by_id = requests(
        build_workload(
            {
                "kind": "agentic",
                "num_sessions": 2,
                "num_steps": 4,
                "system_prompt_len": 60,
                "task_len": 20,
                "tool_output_len": 50,
                "action_len": 8,
            }
        )
    )
    for session in range(2):
        for step in range(4):
            prompt = by_id[f"a{session}-s{step}"].token_ids
            assert len(prompt) == 80 + step * 58
            if step:
                previous = by_id[f"a{session}-s{step - 1}"].token_ids
                assert prompt[: len(previous)] == previous
    assert 60 <= common_prefix(by_id["a0-s0"].token_ids, by_id["a1-s0"].token_ids) < 70


@pytest.mark.parametrize(
    ("params", "lengths", "shared"),
    [
        ({"kind": "seed_multi_turn"}, [10000, 10200], 10000),
        ({"kind": "seed_shared_prefix"}, [1946, 1946, 1946], 560),
        ({"kind": "seed_dcp"}, [44449, 44609], 44449),
        ({"kind": "seed_eagle_resend"}, [7040, 7040], 7040),
        ({"kind": "seed_eagle_resend", "prompt_len": 7296}, [7296, 7296], 7296),
    ],
)
def test_seed_cases_have_the_seeds_lengths_and_sharing(params, lengths, shared):
    prompts = [r.token_ids for r in requests(build_workload(params)).values()]
    assert [len(p) for p in prompts] == lengths
    for later in prompts[1:]:
        assert common_prefix(prompts[0], later) == shared or (
            shared < len(prompts[0]) and shared <= common_prefix(prompts[0], later) < shared + 8
        )


@pytest.mark.parametrize("kind", sorted(WORKLOAD_KINDS))
def test_the_same_seed_gives_the_same_trace_and_another_seed_another(kind):
    first = build_workload({"kind": kind, "seed": 3})
    assert first.jsonl(with_pins=True) == build_workload({"kind": kind, "seed": 3}).jsonl(True)
    other = build_workload({"kind": kind, "seed": 4})
    assert other.jsonl(with_pins=True) != first.jsonl(with_pins=True)
    # every line is a valid replay trace line; pins come first
    lines = first.jsonl(with_pins=True).splitlines()
    items = [parse_line(text, n) for n, text in enumerate(lines, start=1)]
    num_pins = len(first.pins)
    is_chat = kind.startswith("chat_")  # chat workloads pin nothing: message checkpoints do
    assert num_pins >= 1 or is_chat
    assert all(isinstance(i, TracePin) for i in items[:num_pins])
    assert all(isinstance(i, TraceRequest) for i in items[num_pins:])
    longest = max(len(i.token_ids) + i.max_tokens for i in items[num_pins:])
    assert longest == parse_workload({"kind": kind}).max_sequence_len()
    last = json.loads(lines[-1])
    assert last["checkpoint_offsets"] if is_chat else last["prompt"]["segments"]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kind": "nope"}, "does not match any of the expected tags"),
        ({"kind": "generated_shared_prefix", "num_groups": 0}, "greater than or equal to 1"),
        ({"kind": "multi_turn", "answer_len": -5}, "greater than or equal to 1"),
        ({"kind": "agentic", "turns": 3}, "Extra inputs are not permitted"),
        ({"kind": "prefix_repetition", "num_prefixes": 10, "num_prompts": 3}, "at least"),
        ({"kind": "seed_shared_prefix", "shared_len": 2000}, "must be less than prompt_len"),
        ({"kind": "seed_dcp", "consumer_len": 100}, "must exceed producer_len"),
        ({"kind": "generated_shared_prefix", "request_rate": 0}, "greater than 0"),
        ({"kind": "generated_shared_prefix", "system_prompt_len": 10**9}, "less than or equal"),
    ],
)
def test_bad_params_are_refused_with_the_field_named(params, message):
    with pytest.raises(ValidationError) as error:
        parse_workload(params)
    assert message in str(error.value)
