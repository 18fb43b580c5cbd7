"""Seeded init, the model's shape knobs, and the safetensors round trip."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig
from engine.model.build import build_model
from engine.model.hybrid import HybridModel, attention_layer_ids
from tests.engine.model.conftest import PagedKV, prefill_chunks, random_tokens


def test_layer_placement_and_state_shapes(model) -> None:
    assert model.attention_layer_ids == [3, 7]
    assert model.mamba_layer_ids == [0, 1, 2, 4, 5, 6]
    assert attention_layer_ids(12, 3) == [3, 7, 11]
    assert attention_layer_ids(4, 0) == []
    assert (model.num_kv_heads, model.head_dim) == (2, 32)
    assert model.mamba_state_shapes() == ((576, 3), (8, 64, 32))


def test_same_seed_same_weights_other_seed_other_weights(config) -> None:
    a, b = HybridModel(config), HybridModel(config)
    c = HybridModel(dataclasses.replace(config, seed=1))
    for (name, wa), wb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(wa, wb), name
    assert not torch.equal(a.embedding.weight, c.embedding.weight)


def test_greedy_outputs_are_not_degenerate(model) -> None:
    """Greedy continuations vary within a prompt and between prompts."""
    continuations = []
    for prompt in (b"Hello, world", b"0123456789", b"The quick brown fox"):
        ids = torch.tensor(list(prompt))
        for _ in range(12):
            next_id = model.forward_reference(ids)[-1].argmax()
            ids = torch.cat((ids, next_id[None]))
        continuation = ids[len(prompt) :].tolist()
        assert len(set(continuation)) > 1, (prompt, continuation)
        continuations.append(continuation)
    assert len({tuple(c) for c in continuations}) == len(continuations)
    logits = model.forward_reference(random_tokens(6, 64))
    assert logits.isfinite().all() and 0.1 < logits.std() < 10


def test_save_load_round_trip(model, config, tmp_path) -> None:
    path = str(tmp_path / "model.safetensors")
    model.save(path)
    loaded = build_model(dataclasses.replace(config, seed=123, weights_path=path))
    tokens = random_tokens(7, 40)
    torch.testing.assert_close(loaded.forward_reference(tokens), model.forward_reference(tokens))
    out = prefill_chunks(loaded, PagedKV(loaded, 4), [0, 1, 2, 3], tokens, [40])
    torch.testing.assert_close(out.logits, model.forward_reference(tokens)[-1], atol=1e-4, rtol=0)
    assert "lm_head" not in " ".join(load_file(path))  # the head is the embedding


def test_load_rejects_a_wrong_shape_naming_the_tensor(model, config, tmp_path) -> None:
    path = str(tmp_path / "bad.safetensors")
    tensors = {k: v.clone() for k, v in model.state_dict().items()}
    tensors["layers.0.mixer.out_proj.weight"] = torch.zeros(256, 100)
    save_file(tensors, path)
    with pytest.raises(ValueError, match=r"layers\.0\.mixer\.out_proj\.weight.*\(256, 100\)"):
        HybridModel.load(config, path)
    del tensors["layers.0.mixer.out_proj.weight"]
    save_file(tensors, path)
    with pytest.raises(ValueError, match="missing tensors"):
        HybridModel.load(config, path)


def test_build_model_resolves_device_and_dtype() -> None:
    model = build_model(ModelConfig(device="cpu", num_layers=2, num_attention_layers=1))
    assert model.device.type == "cpu" and not model.training
    assert model.embedding.weight.dtype == torch.float32
    default = build_model(ModelConfig(num_layers=1, num_attention_layers=0))
    assert default.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_extra_knobs_reshape_the_mamba_layers() -> None:
    config = ModelConfig(device="cpu", num_layers=2, num_attention_layers=1, extra={"d_state": 16})
    model = build_model(config)
    assert model.mamba_state_shapes() == ((512 + 32, 3), (8, 64, 16))
    tokens = random_tokens(8, 70)
    out = prefill_chunks(model, PagedKV(model, 5), list(range(5)), tokens, [33, 70])
    torch.testing.assert_close(out.logits, model.forward_reference(tokens)[-1], atol=1e-4, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bfloat16_on_cuda_tracks_float32(model, config) -> None:
    gpu = build_model(dataclasses.replace(config, device="cuda", dtype="bfloat16"))
    tokens = random_tokens(9, 300)
    kv = PagedKV(gpu, 20)
    kv.caches = [(k.cuda().bfloat16(), v.cuda().bfloat16()) for k, v in kv.caches]
    out = prefill_chunks(gpu, kv, list(range(20)), tokens, [128, 299])
    step = gpu.decode(
        tokens[299:300],
        torch.tensor([299]),
        kv.caches,
        kv.slots(list(range(20)), 299, 300),
        [kv.slots(list(range(20)), 0, 300)],
        [(c[None], s[None]) for c, s in out.final_states],
    )
    reference = model.forward_reference(tokens)
    assert out.logits.dtype == torch.float32 and step.logits.dtype == torch.float32
    for got, want in ((out.logits.cpu(), reference[298]), (step.logits[0].cpu(), reference[299])):
        assert (got - want).abs().max() < 0.25 * want.abs().max()
        assert got.argmax() == want.argmax() or want.topk(3).indices.eq(got.argmax()).any()
