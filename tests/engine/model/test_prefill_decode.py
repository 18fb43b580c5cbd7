"""The cached paths (chunked prefill, batched decode, paged KV) against `forward_reference`."""

from __future__ import annotations

import random

import pytest
import torch

from engine.model import attention
from tests.engine.model.conftest import (
    BLOCK_SIZE,
    PagedKV,
    batch_states,
    prefill_chunks,
    random_tokens,
)

ATOL = 1e-4


def decode_one(model, kv, block_ids, token_id, position, states):
    return model.decode(
        torch.tensor([token_id]),
        torch.tensor([position]),
        kv.caches,
        kv.slots(block_ids, position, position + 1),
        [kv.slots(block_ids, 0, position + 1)],
        [(conv[None], ssm[None]) for conv, ssm in states],
    )


def test_one_chunk_prefill_matches_reference(model) -> None:
    tokens = random_tokens(0, 150)
    kv = PagedKV(model, num_blocks=16)
    out = prefill_chunks(model, kv, list(range(16)), tokens, [150])
    reference = model.forward_reference(tokens)
    assert out.logits.shape == (model.config.vocab_size,)
    assert out.logits.dtype == torch.float32
    torch.testing.assert_close(out.logits, reference[-1], atol=ATOL, rtol=0)


def test_chunked_prefill_then_decode_matches_reference(model) -> None:
    tokens = random_tokens(1, 190)
    reference = model.forward_reference(tokens)
    block_ids = list(range(12))
    whole = prefill_chunks(model, PagedKV(model, 12), block_ids, tokens, [150])

    kv = PagedKV(model, 12)
    out = prefill_chunks(model, kv, block_ids, tokens, [37, 64, 100, 150])
    torch.testing.assert_close(out.logits, whole.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.logits, reference[149], atol=ATOL, rtol=0)

    states = out.final_states
    for position in range(150, 190):
        step = decode_one(model, kv, block_ids, int(tokens[position]), position, states)
        torch.testing.assert_close(step.logits[0], reference[position], atol=ATOL, rtol=0)
        states = [(conv[0], ssm[0]) for conv, ssm in step.new_states]


def test_saved_states_resume_like_a_chunk_boundary(model) -> None:
    """The state saved at an offset is the final state of a prefill that stops there."""
    tokens = random_tokens(2, 120)
    block_ids = list(range(8))
    out = prefill_chunks(model, PagedKV(model, 8), block_ids, tokens, [120], [30, 77, 120])
    for offset in (30, 77):
        stop = prefill_chunks(model, PagedKV(model, 8), block_ids, tokens, [offset])
        for (conv, ssm), (conv_ref, ssm_ref) in zip(
            out.saved_states[offset], stop.final_states, strict=True
        ):
            torch.testing.assert_close(conv, conv_ref, atol=1e-5, rtol=0)
            torch.testing.assert_close(ssm, ssm_ref, atol=1e-5, rtol=1e-5)
    for (conv, ssm), (conv_f, ssm_f) in zip(out.saved_states[120], out.final_states, strict=True):
        assert torch.equal(conv, conv_f) and torch.equal(ssm, ssm_f)


def test_prefill_tiles_queries_without_changing_logits(model, monkeypatch) -> None:
    tokens = random_tokens(3, 100)
    reference = model.forward_reference(tokens)
    monkeypatch.setattr(attention, "PREFILL_SCORE_BUDGET", 1)  # 16-query tiles
    out = prefill_chunks(model, PagedKV(model, 8), list(range(8)), tokens, [40, 100])
    torch.testing.assert_close(out.logits, reference[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("gather_budget", [1 << 19, 1])
def test_batched_decode_equals_decoding_each_alone(model, monkeypatch, gather_budget) -> None:
    monkeypatch.setattr(attention, "DECODE_GATHER_BUDGET", gather_budget)
    lengths = [20, 45, 70]
    tables = [[0, 1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    kv = PagedKV(model, 15)
    prompts = [random_tokens(10 + i, n) for i, n in enumerate(lengths)]
    finals = [
        prefill_chunks(model, kv, table, prompt, [len(prompt)]).final_states
        for table, prompt in zip(tables, prompts, strict=True)
    ]
    next_ids = [5, 77, 200]

    alone = [
        decode_one(model, kv.clone(), table, next_id, n, states)
        for table, next_id, n, states in zip(tables, next_ids, lengths, finals, strict=True)
    ]
    batched = model.decode(
        torch.tensor(next_ids),
        torch.tensor(lengths),
        kv.caches,
        torch.cat([kv.slots(t, n, n + 1) for t, n in zip(tables, lengths, strict=True)]),
        [kv.slots(t, 0, n + 1) for t, n in zip(tables, lengths, strict=True)],
        batch_states(finals),
    )
    assert batched.logits.shape == (3, model.config.vocab_size)
    for i, single in enumerate(alone):
        torch.testing.assert_close(batched.logits[i], single.logits[0], atol=1e-5, rtol=0)
        for (conv, ssm), (conv_1, ssm_1) in zip(batched.new_states, single.new_states, strict=True):
            torch.testing.assert_close(conv[i], conv_1[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(ssm[i], ssm_1[0], atol=1e-5, rtol=0)


def test_scattered_blocks_give_the_same_logits_as_contiguous_ones(model) -> None:
    tokens = random_tokens(4, 130)
    num_blocks = -(-131 // BLOCK_SIZE)
    contiguous = list(range(num_blocks))
    scattered = random.Random(0).sample(range(40), num_blocks)
    results = []
    for table in (contiguous, scattered):
        kv = PagedKV(model, 40)
        out = prefill_chunks(model, kv, table, tokens, [50, 129])
        step = decode_one(model, kv, table, int(tokens[129]), 129, out.final_states)
        results.append((out.logits, step.logits[0]))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-5, rtol=0)


def test_prefill_rejects_inconsistent_slots_and_offsets(model) -> None:
    kv = PagedKV(model, 4)
    tokens = random_tokens(5, 10)
    slots = kv.slots([0, 1, 2, 3], 0, 10)
    with pytest.raises(ValueError, match="context slots"):
        model.prefill(tokens, 0, kv.caches, slots, slots[:9], None, [])
    with pytest.raises(ValueError, match="save offsets"):
        model.prefill(tokens, 0, kv.caches, slots, slots, None, [0, 11])
    with pytest.raises(ValueError, match="context lengths"):
        model.decode(tokens[:1], torch.tensor([10]), kv.caches, slots[:1], [slots[:10]], [])
