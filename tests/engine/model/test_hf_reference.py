"""Hugging Face checkpoints on Junction's paged paths against transformers' own forward.

Per variant (Bamba, Granite dense and with experts, Nemotron-H with - and E blocks, Qwen3.5
dense and MoE, Qwen3-Next), on the CPU in float32: the logits at every position of a few
prompts, through chunked prefill and through decode, equal transformers' within 1e-4; the greedy
continuation of 32 tokens through the engine equals `generate`; and prefill split into chunks,
or resumed from cached blocks and saved states, gives the same logits.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.engine import Engine
from engine.model.hf import load_hf_model
from engine.request import SamplingParams
from engine.runners.torch_runner import TorchRunner
from tests.engine.model.conftest import PagedKV, prefill_chunks
from tests.engine.model.hf_checkpoints import VARIANTS

ATOL = 1e-4
MESSAGES = [
    [{"role": "user", "content": "Hello, world! How are you today?"}],
    [
        {"role": "system", "content": "You are a state space model."},
        {"role": "user", "content": "The quick brown fox jumps over the lazy dog."},
    ],
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=list(VARIANTS))
def model_dir(request, checkpoints) -> Path:
    return checkpoints.get(request.param)


@pytest.fixture(scope="module")
def reference(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()


@pytest.fixture(scope="module")
def model(model_dir):
    return load_hf_model(model_dir, "float32", "cpu")


@pytest.fixture(scope="module")
def prompts(model_dir) -> list[torch.Tensor]:
    """Chat prompts rendered by the checkpoint's template, and one of random ids."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rendered = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, return_dict=False)
        for m in MESSAGES
    ]
    noise = torch.randint(0, 384, (70,), generator=torch.Generator().manual_seed(0))
    return [torch.tensor(ids) for ids in rendered] + [noise]


def reference_logits(reference, token_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return reference(token_ids[None]).logits[0].float()  # [l, V]


def test_logits_equal_transformers_at_every_position(model, reference, prompts) -> None:
    for tokens in prompts:
        want = reference_logits(reference, tokens)
        length = len(tokens)
        torch.testing.assert_close(model.forward_reference(tokens), want, atol=ATOL, rtol=0)

        # prefill, one position per chunk: each chunk's logits are its position's
        kv, states, block_ids = PagedKV(model, 8), None, list(range(8))
        for position in range(length):
            out = model.prefill(
                tokens[position : position + 1],
                position,
                kv.caches,
                kv.slots(block_ids, position, position + 1),
                kv.slots(block_ids, 0, position + 1),
                states,
                [],
            )
            torch.testing.assert_close(
                out.logits, want[position], atol=ATOL, rtol=0, msg=str(position)
            )
            states = out.final_states

        # decode after a 1-token prefill: every later position through the batched step
        kv = PagedKV(model, 8)
        states = prefill_chunks(model, kv, block_ids, tokens, [1]).final_states
        for position in range(1, length):
            step = model.decode(
                tokens[position : position + 1],
                torch.tensor([position]),
                kv.caches,
                kv.slots(block_ids, position, position + 1),
                [kv.slots(block_ids, 0, position + 1)],
                [(conv[None], ssm[None]) for conv, ssm in states],
            )
            torch.testing.assert_close(step.logits[0], want[position], atol=ATOL, rtol=0)
            states = [(conv[0], ssm[0]) for conv, ssm in step.new_states]


def test_greedy_continuation_equals_generate(model_dir, reference, prompts) -> None:
    """Through the engine and the torch runner, as `junction serve --model DIR` runs it."""
    cache = CacheConfig(block_size=8, mamba_block_size=32, num_blocks=64, num_mamba_blocks=16)
    config = ModelConfig(model_dir=str(model_dir), device="cpu")
    engine = Engine(cache, SchedulerConfig(), config, runner=TorchRunner(cache, config))
    prompt = prompts[0].tolist()
    (request,) = engine.generate([prompt], SamplingParams(max_tokens=32))
    with torch.no_grad():
        generated = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=32,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    want = generated[0, len(prompt) :].tolist()
    assert len(want) == 32 and len(set(want)) > 4  # a continuation worth comparing
    assert request.output_token_ids == want


def test_chunked_and_resumed_prefill_give_the_same_logits(model, prompts) -> None:
    tokens = prompts[2]  # 70 tokens
    block_ids = list(range(10))
    whole = prefill_chunks(model, PagedKV(model, 10), block_ids, tokens, [70], [24, 70])
    for bounds in ([5, 6, 40, 70], [33, 70], [1, 69, 70]):
        out = prefill_chunks(model, PagedKV(model, 10), block_ids, tokens, bounds)
        torch.testing.assert_close(out.logits, whole.logits, atol=ATOL, rtol=0, msg=str(bounds))

    # resume at 24 from the cached K/V of positions < 24 (blocks 0-2, block size 8) and the
    # states saved at offset 24, into a new request's own blocks for the rest
    kv = PagedKV(model, 10)
    first = prefill_chunks(model, kv, block_ids, tokens, [70], [24])
    table = [0, 1, 2, 7, 8, 9, 4, 5, 6]
    resumed = model.prefill(
        tokens[24:],
        24,
        kv.caches,
        kv.slots(table, 24, 70),
        kv.slots(table, 0, 70),
        first.saved_states[24],
        [],
    )
    torch.testing.assert_close(resumed.logits, whole.logits, atol=ATOL, rtol=0)


def test_geometry_follows_the_config(model) -> None:
    spec = model.spec
    assert spec.num_attention_layers >= 2 and spec.num_mamba_layers >= 2
    assert len(model.attention_layer_ids) == spec.num_attention_layers
    assert len(model.mamba_layer_ids) == spec.num_mamba_layers
    assert (model.num_kv_heads, model.head_dim) == (spec.num_kv_heads, spec.head_dim)
    assert (model.lm_head is None) == spec.tie_word_embeddings
    conv_shape, ssm_shape = model.mamba_state_shapes()
    if spec.state_kind == "linear":  # Gated DeltaNet: q, k (2 heads of 8) and v (4 of 8)
        want_conv, want_ssm = (2 * 2 * 8 + 4 * 8, 3), (4, 8, 8)
    else:  # Mamba-2: x (8 heads of 8), B and C (2 groups of 8)
        want_conv, want_ssm = (64 + 2 * 2 * 8, 3), (8, 8, 8)
    assert conv_shape == spec.mamba.conv_state_shape == want_conv
    assert ssm_shape == spec.mamba.ssm_state_shape == want_ssm
    per_token = 2 * spec.num_attention_layers * spec.num_kv_heads * spec.head_dim * 2
    assert spec.attention_bytes_per_token("bfloat16") == per_token
    per_slot = spec.num_mamba_layers * (math.prod(want_conv) + math.prod(want_ssm)) * 4
    assert spec.mamba_bytes_per_slot("float32") == per_slot
    assert spec.state_kind == ("linear" if spec.architecture.startswith("Qwen") else "mamba")
    if spec.architecture == "NemotronHForCausalLM":
        symbols = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
        assert "".join(symbols[kind] for kind in spec.layer_kinds) == "M-M*E-*E"
        assert spec.head_dim == 16 != spec.hidden_size // spec.num_attention_heads


def test_bfloat16_tracks_float32(model_dir, model, reference, prompts) -> None:
    """The same checkpoint read into bfloat16 strays from float32 by about what transformers'
    own bfloat16 forward does (a MoE router's near ties flip in bfloat16, on both sides, so the
    error is compared per position on average, not at one position)."""
    half = load_hf_model(model_dir, "bfloat16", "cpu")
    assert half.embedding.weight.dtype == torch.bfloat16
    tokens = prompts[2]
    want = model.forward_reference(tokens)  # [l, V] float32
    reference_half = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16, local_files_only=True
    ).eval()
    theirs = (reference_logits(reference_half, tokens) - want).abs().amax(-1).mean()
    ours = (half.forward_reference(tokens).float() - want).abs().amax(-1).mean()
    assert ours < 2 * theirs + 0.01 * want.abs().max()
    out = prefill_chunks(half, PagedKV(half, 10), list(range(10)), tokens, [40, 70])
    assert out.logits.dtype == torch.float32
    torch.testing.assert_close(
        out.logits, half.forward_reference(tokens)[-1].float(), atol=0.1, rtol=0
    )
