"""The chunked SSD scan against the token-by-token recurrence, and states at save offsets."""

from __future__ import annotations

import pytest
import torch

from engine.model.mamba2 import Mamba2Mixer, MambaShape
from engine.model.ssd import chunked_scan, sequential_scan


def scan_inputs(length: int, dtype: torch.dtype, seed: int = 0, h: int = 4, p: int = 8, n: int = 6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(length, h, p, generator=g, dtype=dtype)
    dt = torch.rand(length, h, generator=g, dtype=dtype) * 0.2 + 0.01
    A = -(torch.rand(h, generator=g, dtype=dtype) * 4 + 0.5)
    B = torch.randn(length, h, n, generator=g, dtype=dtype)
    C = torch.randn(length, h, n, generator=g, dtype=dtype)
    state = torch.randn(h, p, n, generator=g, dtype=dtype)
    return x, dt, A, B, C, state


@pytest.mark.parametrize("length", [1, 17, 63, 64, 65, 128, 200])
def test_chunked_scan_equals_sequential_scan(length: int) -> None:
    inputs = scan_inputs(length, torch.float32, seed=length)
    y_seq, s_seq = sequential_scan(*inputs)
    y_chunk, s_chunk, _ = chunked_scan(*inputs, chunk_size=64)
    torch.testing.assert_close(y_chunk, y_seq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_chunk, s_seq, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 7, 64])
def test_chunked_scan_is_exact_in_float64(chunk_size: int) -> None:
    inputs = scan_inputs(150, torch.float64, seed=chunk_size)
    y_seq, s_seq = sequential_scan(*inputs)
    y_chunk, s_chunk, _ = chunked_scan(*inputs, chunk_size=chunk_size)
    torch.testing.assert_close(y_chunk, y_seq, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s_chunk, s_seq, atol=1e-10, rtol=1e-10)


def test_saved_states_equal_the_recurrent_states_at_their_offsets() -> None:
    """Mixer prefill with save offsets against `step` run token by token from the same state."""
    mixer = Mamba2Mixer(MambaShape(d=32, headdim=16, d_state=8, chunk_size=16))
    mixer.reset_parameters(torch.Generator().manual_seed(3), out_scale=0.5)
    g = torch.Generator().manual_seed(4)
    u = torch.randn(90, 32, generator=g)
    conv_shape, ssm_shape = mixer.shape.state_shapes()
    state = (torch.randn(conv_shape, generator=g), torch.randn(ssm_shape, generator=g))
    offsets = [1, 2, 16, 18, 34, 40, 41, 57, 90]  # on the chunk grid (16) and off it

    with torch.no_grad():
        out = mixer.prefill(u, state, offsets)
        stepped = {}
        step_state = (state[0][None], state[1][None])
        ys = []
        for t in range(u.shape[0]):
            y, step_state = mixer.step(u[t : t + 1], step_state)
            ys.append(y[0])
            stepped[t + 1] = (step_state[0][0], step_state[1][0])

    torch.testing.assert_close(out.y, torch.stack(ys), atol=1e-5, rtol=1e-5)
    assert sorted(out.saved_states) == offsets
    for offset in offsets:
        conv, ssm = out.saved_states[offset]
        torch.testing.assert_close(conv, stepped[offset][0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ssm, stepped[offset][1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.final_state[1], stepped[90][1], atol=1e-5, rtol=1e-5)


ENDS = [0, 5, 16, 17, 47, 48, 144, 149, 150]  # on the chunk grid of 16, inside chunks, 0, l


def test_states_at_any_offset_equal_the_recurrence() -> None:
    inputs = scan_inputs(150, torch.float64, seed=9)
    _, final, at = chunked_scan(*inputs, chunk_size=16, offsets=ENDS)
    assert sorted(at) == ENDS and at[150] is final
    for end in ENDS:
        _, state = sequential_scan(
            *(t[:end] for t in inputs[:2]), inputs[2], *(t[:end] for t in inputs[3:5]), inputs[5]
        )
        torch.testing.assert_close(at[end], state, atol=1e-10, rtol=1e-10, msg=str(end))
    # the state one token on is another state: a read that ignored the offset would not pass
    assert not torch.allclose(at[17], at[16]) and not torch.allclose(at[149], at[150])
