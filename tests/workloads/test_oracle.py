"""The oracle on hand-made traces: what is truly shared, floored to the unit, capped as a hit."""

from __future__ import annotations

import json
import random

import pytest

from engine.traces.trace import parse_line
from workloads import capped_hit, oracle


def trace(*lines: dict) -> list:
    return [parse_line(json.dumps(line), n) for n, line in enumerate(lines, start=1)]


def req(rid: str, tokens: list[int], salt: str | None = None) -> dict:
    line = {"id": rid, "prompt_token_ids": tokens}
    if salt is not None:
        line["cache_salt"] = salt
    return line


def pin(tokens: list[int]) -> dict:
    return {"pin": tokens}


def hits(items, unit, eagle=False, outputs=None) -> list[int]:
    return [h.num_oracle_tokens for h in oracle(items, unit, eagle, outputs).hits]


A = list(range(1, 41))  # 40 distinct tokens


def test_the_first_request_hits_nothing_and_a_resend_leaves_the_last_token():
    items = trace(req("a", A[:10]), req("b", A[:10]))
    assert hits(items, 4) == [0, 8]  # floor((10 - 1) / 4) * 4
    assert hits(items, 1) == [0, 9]  # P - 1
    assert hits(items, 5) == [0, 5]  # 10 is a multiple of 5: still one token to compute


def test_the_design_worked_example_with_and_without_eagle():
    # two cached 4-token blocks, a 9-token request, U 2: 8 without EAGLE, 6 with
    items = trace(req("a", A[:8]), req("b", A[:9]))
    assert hits(items, 2) == [0, 8]
    assert hits(items, 2, eagle=True) == [0, 6]
    # one full block plus 2 more shared tokens: the hit is 6, and 4 with EAGLE
    items = trace(req("a", A[:6] + [99, 98]), req("b", A[:9]))
    assert hits(items, 2) == [0, 6]
    assert hits(items, 2, eagle=True) == [0, 4]


def test_sharing_is_floored_to_the_unit_and_takes_the_longest_earlier_prompt():
    items = trace(
        req("a", A[:7] + [100] * 10),  # shares 7 with c
        req("b", A[:13] + [200] * 10),  # shares 13 with c
        req("c", A[:30]),
        req("d", [7] * 30),  # shares nothing
    )
    assert hits(items, 4) == [0, 4, 12, 0]  # b shares 7 with a -> 4; c 13 with b -> 12


def test_only_earlier_requests_count():
    items = trace(req("a", A[:10]), req("b", A[:30]))
    assert hits(items, 2) == [0, 10]  # a could not have used b


def test_eagle_resend_drops_one_unit_below_the_unit_floor():
    for length, expected in ((7040, 6912), (7296, 7168)):
        prompt = [random.Random(length).randrange(256) for _ in range(length)]
        assert hits(trace(req("a", prompt), req("b", prompt)), 128, eagle=True) == [0, expected]
        assert capped_hit(length, length, 128, eagle=True) == expected


def test_pins_count_for_the_requests_after_them():
    items = trace(req("a", A[:20]), pin(A[:12]), req("b", A[:12] + [77] * 8))
    assert hits(items, 4) == [0, 12]
    pinned_first = trace(pin(A[:12]), req("a", A[:20]))
    assert hits(pinned_first, 4) == [12]
    assert hits(trace(req("a", A[:20]), pin(A[:12])), 4) == [0]


def test_another_cache_salt_shares_nothing():
    items = trace(req("a", A[:20], "t1"), req("b", A[:20], "t2"), req("c", A[:20], "t1"))
    assert hits(items, 4) == [0, 0, 16]


def test_outputs_count_when_given():
    output = [300, 301, 302, 303, 304, 305, 306, 307]
    items = trace(req("a", A[:8]), req("b", A[:8] + output + [1] * 4))
    assert hits(items, 4) == [0, 8]
    assert hits(items, 4, outputs={"a": output}) == [0, 16]


def test_totals_and_rate():
    result = oracle(trace(req("a", A[:10]), req("b", A[:10])), 4)
    assert (result.num_prompt_tokens, result.num_oracle_tokens) == (20, 8)
    assert result.hit_rate == pytest.approx(0.4)
    assert result.as_dict() == {"num_prompt_tokens": 20, "num_oracle_tokens": 8, "hit_rate": 0.4}


@pytest.mark.parametrize("seed", range(5))
def test_equals_a_brute_force_longest_common_prefix(seed):
    rng = random.Random(seed)
    stems = [[rng.randrange(4) for _ in range(40)] for _ in range(3)]  # small alphabet: overlaps
    prompts = []
    for _ in range(25):
        stem = rng.choice(stems)
        cut = rng.randrange(1, 40)
        prompts.append(stem[:cut] + [rng.randrange(4) for _ in range(rng.randrange(1, 20))])
    unit, eagle = rng.choice([1, 2, 4, 8]), rng.random() < 0.5

    def lcp(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    expected = []
    for i, prompt in enumerate(prompts):
        shared = max([lcp(prompt, earlier) for earlier in prompts[:i]], default=0)
        expected.append(capped_hit(shared, len(prompt), unit, eagle))
    items = trace(*(req(f"r{i}", p) for i, p in enumerate(prompts)))
    assert hits(items, unit, eagle) == expected
    assert all(h % unit == 0 and h < len(p) for h, p in zip(expected, prompts, strict=True))
