"""The Gated DeltaNet mixer: the chunked rule against the token-by-token recurrence, states at
save offsets, prefill/step agreement, and transformers' Qwen3.5 / Qwen3-Next layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    Qwen3_5GatedDeltaNet,
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)
from transformers.models.qwen3_next import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

from engine.model.delta_rule import chunked_rule, sequential_rule
from engine.model.gdn import GatedDeltaNet, GDNShape

# Hv = 2 * Hk: q and k are shared by pairs of value heads (GQA).
SHAPE = GDNShape(d=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=6, chunk_size=16)


def rule_inputs(
    length: int, dtype: torch.dtype, seed: int = 0, h: int = 4, dk: int = 8, dv: int = 6
):
    """Raw q, k (not normalised), v, g, beta and a nonzero state, as the mixer would feed them."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(length, h, dk, generator=g, dtype=dtype)
    k = torch.randn(length, h, dk, generator=g, dtype=dtype)
    v = torch.randn(length, h, dv, generator=g, dtype=dtype)
    log_decay = -(torch.rand(length, h, generator=g, dtype=dtype) * 0.5 + 0.01)
    beta = torch.sigmoid(torch.randn(length, h, generator=g, dtype=dtype))
    state = torch.randn(h, dk, dv, generator=g, dtype=dtype)
    return q, k, v, log_decay, beta, state


def normalised(q, k, v, g, beta, state):
    """The rule's own convention: q and k L2-normalised, q scaled by dk^-0.5."""
    dk = q.shape[-1]
    return F.normalize(q, dim=-1) * dk**-0.5, F.normalize(k, dim=-1), v, g, beta, state


def make_mixer(fused: bool = False, shape: GDNShape = SHAPE, seed: int = 3) -> GatedDeltaNet:
    mixer = GatedDeltaNet(shape, fused=fused)
    mixer.reset_parameters(torch.Generator().manual_seed(seed), out_scale=0.5)
    with torch.no_grad():  # a norm weight away from 1 so the test sees it
        mixer.norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(seed))
    return mixer


def random_state(mixer: GatedDeltaNet, seed: int):
    g = torch.Generator().manual_seed(seed)
    conv_shape, rec_shape = mixer.shape.state_shapes()
    return torch.randn(conv_shape, generator=g), torch.randn(rec_shape, generator=g) * 0.3


def step_through(mixer: GatedDeltaNet, u: torch.Tensor, state):
    """`step` token by token: the outputs [l, d] and the state after every token count."""
    step_state = (state[0][None], state[1][None])
    ys, states = [], {0: state}
    for t in range(u.shape[0]):
        y, step_state = mixer.step(u[t : t + 1], step_state)
        ys.append(y[0])
        states[t + 1] = (step_state[0][0], step_state[1][0])
    return torch.stack(ys), states


# --- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 17, 63, 64, 65, 128, 200])
def test_chunked_rule_equals_sequential_rule(length: int) -> None:
    inputs = normalised(*rule_inputs(length, torch.float32, seed=length))
    o_seq, s_seq = sequential_rule(*inputs)
    o_chunk, s_chunk, _ = chunked_rule(*inputs, chunk_size=64)
    torch.testing.assert_close(o_chunk, o_seq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_chunk, s_seq, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 7, 64])
def test_chunked_rule_is_exact_in_float64(chunk_size: int) -> None:
    inputs = normalised(*rule_inputs(150, torch.float64, seed=chunk_size))
    o_seq, s_seq = sequential_rule(*inputs)
    o_chunk, s_chunk, _ = chunked_rule(*inputs, chunk_size=chunk_size)
    torch.testing.assert_close(o_chunk, o_seq, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s_chunk, s_seq, atol=1e-10, rtol=1e-10)


def test_states_at_any_offset_equal_the_recurrence() -> None:
    """On the chunk grid of 16, inside chunks, at 0 and at the end."""
    q, k, v, g, beta, state = normalised(*rule_inputs(150, torch.float64, seed=9))
    ends = [0, 5, 16, 17, 47, 48, 144, 149, 150]
    _, final, at = chunked_rule(q, k, v, g, beta, state, chunk_size=16, offsets=ends)
    assert sorted(at) == ends and at[150] is final
    for end in ends:
        _, expected = sequential_rule(q[:end], k[:end], v[:end], g[:end], beta[:end], state)
        torch.testing.assert_close(at[end], expected, atol=1e-10, rtol=1e-10, msg=str(end))
    assert not torch.allclose(at[17], at[16]) and not torch.allclose(at[149], at[150])


@pytest.mark.parametrize("length", [50, 64, 130])
def test_rules_equal_transformers(length: int) -> None:
    """transformers normalises q, k in the kernel and scales q itself; ours takes them ready."""
    raw = rule_inputs(length, torch.float32, seed=length + 1)
    q, k, v, g, beta, state = raw
    theirs = {
        "g": g[None],
        "beta": beta[None],
        "initial_state": state[None],
        "output_final_state": True,
        "use_qk_l2norm_in_kernel": True,
    }
    o_chunk, s_chunk, _ = chunked_rule(*normalised(*raw), chunk_size=64)
    o_seq, s_seq = sequential_rule(*normalised(*raw))
    o_ref, s_ref = torch_chunk_gated_delta_rule(q[None], k[None], v[None], chunk_size=64, **theirs)
    o_rec, s_rec = torch_recurrent_gated_delta_rule(q[None], k[None], v[None], **theirs)
    torch.testing.assert_close(o_chunk, o_ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_chunk, s_ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o_seq, o_rec[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_seq, s_rec[0], atol=1e-5, rtol=1e-5)


# --- the mixer's paths against one another ----------------------------------------------------


@pytest.mark.parametrize("fused", [False, True])
def test_saved_states_equal_the_recurrent_states_at_their_offsets(fused: bool) -> None:
    mixer = make_mixer(fused)
    u = torch.randn(90, SHAPE.d, generator=torch.Generator().manual_seed(4))
    state = random_state(mixer, 5)
    offsets = [0, 1, 2, 16, 18, 34, 40, 41, 57, 90]  # 18 -> 34: on the grid of the scan from 2

    with torch.no_grad():
        out = mixer.prefill(u, state, offsets)
        ys, stepped = step_through(mixer, u, state)

    torch.testing.assert_close(out.y, ys, atol=1e-5, rtol=1e-5)
    assert sorted(out.saved_states) == offsets
    for offset in offsets:
        conv, rec = out.saved_states[offset]
        assert conv.dtype == rec.dtype == torch.float32
        torch.testing.assert_close(conv, stepped[offset][0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(rec, stepped[offset][1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.final_state[0], stepped[90][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.final_state[1], stepped[90][1], atol=1e-5, rtol=1e-5)


def test_an_off_grid_state_is_not_the_next_tokens_state() -> None:
    """Saved states are the state after exactly that many tokens, not the neighbouring one."""
    mixer = make_mixer()
    u = torch.randn(60, SHAPE.d, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        saved = mixer.prefill(u, mixer.zero_state(u.device), [21, 22]).saved_states
    assert (saved[21][1] - saved[22][1]).abs().max() > 1e-3
    assert not torch.equal(saved[21][0], saved[22][0])


def test_saved_states_do_not_alias_the_input_state() -> None:
    mixer = make_mixer()
    state = random_state(mixer, 7)
    u = torch.randn(5, SHAPE.d)
    with torch.no_grad():
        out = mixer.prefill(u, state, [0])
    before = state[1].clone()
    out.saved_states[0][1].add_(1.0)
    out.saved_states[0][0].add_(1.0)
    torch.testing.assert_close(state[1], before, atol=0, rtol=0)
    assert not torch.equal(state[0], out.saved_states[0][0])


@pytest.mark.parametrize("split", [16, 23, 40])
def test_prefill_in_two_pieces_equals_one_prefill(split: int) -> None:
    mixer = make_mixer()
    u = torch.randn(75, SHAPE.d, generator=torch.Generator().manual_seed(split))
    state = random_state(mixer, 8)
    with torch.no_grad():
        whole = mixer.prefill(u, state, [])
        first = mixer.prefill(u[:split], state, [])
        second = mixer.prefill(u[split:], first.final_state, [])
    torch.testing.assert_close(torch.cat((first.y, second.y)), whole.y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second.final_state[0], whole.final_state[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(second.final_state[1], whole.final_state[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_prefill_then_step_equals_prefill_of_the_whole(fused: bool) -> None:
    mixer = make_mixer(fused)
    u = torch.randn(45, SHAPE.d, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        whole = mixer.prefill(u, mixer.zero_state(u.device), [])
        head = mixer.prefill(u[:37], mixer.zero_state(u.device), [])
        ys, stepped = step_through(mixer, u[37:], head.final_state)
        reference = mixer.forward_reference(u)
    torch.testing.assert_close(torch.cat((head.y, ys)), whole.y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stepped[8][1], whole.final_state[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(whole.y, reference, atol=1e-5, rtol=1e-5)


def test_step_of_a_batch_equals_step_of_each_sequence() -> None:
    mixer = make_mixer()
    u = torch.randn(3, SHAPE.d, generator=torch.Generator().manual_seed(10))
    states = [random_state(mixer, 20 + i) for i in range(3)]
    batch = (torch.stack([s[0] for s in states]), torch.stack([s[1] for s in states]))
    with torch.no_grad():
        y, (conv, rec) = mixer.step(u, batch)
        for i, state in enumerate(states):
            y_i, (conv_i, rec_i) = mixer.step(u[i : i + 1], (state[0][None], state[1][None]))
            torch.testing.assert_close(y[i], y_i[0], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(rec[i], rec_i[0], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(conv[i], conv_i[0], atol=1e-6, rtol=1e-6)


def test_bad_shapes_and_offsets_raise() -> None:
    with pytest.raises(ValueError, match="multiple"):
        GatedDeltaNet(GDNShape(d=16, num_k_heads=3, num_v_heads=4, head_k_dim=4, head_v_dim=4))
    mixer = make_mixer()
    with pytest.raises(ValueError, match=r"\[11\]"):
        mixer.prefill(torch.randn(10, SHAPE.d), mixer.zero_state(torch.device("cpu")), [5, 11])


# --- against transformers -----------------------------------------------------------------------


def hf_kwargs(shape: GDNShape) -> dict:
    return {
        "hidden_size": shape.d,
        "linear_num_key_heads": shape.num_k_heads,
        "linear_num_value_heads": shape.num_v_heads,
        "linear_key_head_dim": shape.head_k_dim,
        "linear_value_head_dim": shape.head_v_dim,
        "linear_conv_kernel_dim": shape.conv_kernel,
        "rms_norm_eps": 1e-6,
        "num_hidden_layers": 1,
        "layer_types": ["linear_attention"],
    }


@pytest.mark.parametrize("fused", [False, True])
def test_mixer_equals_transformers(fused: bool) -> None:
    torch.manual_seed(11)  # transformers' layers draw their init from the global generator
    if fused:
        theirs = Qwen3NextGatedDeltaNet(Qwen3NextConfig(**hf_kwargs(SHAPE)), layer_idx=0)
    else:
        theirs = Qwen3_5GatedDeltaNet(Qwen3_5TextConfig(**hf_kwargs(SHAPE)), layer_idx=0)
    with torch.no_grad():  # move the parameters that init to constants
        theirs.dt_bias.uniform_(-2.0, 1.0)
        theirs.norm.weight.uniform_(0.5, 1.5)
    weights = theirs.state_dict()
    weights["conv_weight"] = weights.pop("conv1d.weight").squeeze(1)  # [m, 1, k] -> [m, k]
    ours = GatedDeltaNet(SHAPE, fused=fused)
    ours.load_state_dict(weights, strict=True)  # the names are the checkpoint's

    u = torch.randn(100, SHAPE.d, generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        expected = theirs(u[None])[0]
        out = ours.prefill(u, ours.zero_state(u.device), [30, 64])
    torch.testing.assert_close(out.y, expected, atol=1e-4, rtol=1e-4)
