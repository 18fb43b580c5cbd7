"""Bad checkpoint directories fail at load, before any request, with errors that name the cause.

Also: a sharded checkpoint loads to the same model as a single file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from engine.config import CacheConfig, ModelConfig
from engine.model.hf import SUPPORTED, load_hf_model, load_spec
from engine.runners.torch_runner import TorchRunner
from tests.engine.model.hf_checkpoints import CheckpointCache

pytestmark = pytest.mark.usefixtures("one_thread")


def copy_of(checkpoints: CheckpointCache, variant: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(checkpoints.get(variant), tmp_path / variant))


def edit_config(model_dir: Path, **changes) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, **changes}))


def shard(model_dir: Path) -> list[str]:
    """Re-save `model_dir`'s weights as several shards with an index; returns the shard names."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    (model_dir / "model.safetensors").unlink()
    model.save_pretrained(model_dir, max_shard_size="40KB")
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))


def test_a_sharded_checkpoint_loads_like_a_single_file(checkpoints, tmp_path) -> None:
    single = load_hf_model(checkpoints.get("nemotron-h"))
    model_dir = copy_of(checkpoints, "nemotron-h", tmp_path)
    assert len(shard(model_dir)) > 2
    sharded = load_hf_model(model_dir)
    tokens = torch.arange(6, 60)
    assert torch.equal(sharded.forward_reference(tokens), single.forward_reference(tokens))


def test_a_missing_shard_is_named(checkpoints, tmp_path) -> None:
    model_dir = copy_of(checkpoints, "bamba", tmp_path)
    lost = shard(model_dir)[1]
    (model_dir / lost).unlink()
    with pytest.raises(ValueError, match=f"shard files \\['{lost}'\\].*missing"):
        load_hf_model(model_dir)


def test_a_tensor_of_the_wrong_shape_is_named_with_both_shapes(checkpoints, tmp_path) -> None:
    model_dir = copy_of(checkpoints, "granite-moe", tmp_path)
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    name = "model.layers.1.self_attn.k_proj.weight"
    assert tensors[name].shape == (16, 32)
    tensors[name] = torch.zeros(24, 32)
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"{name} has shape \(24, 32\), expected \(16, 32\)"):
        load_hf_model(model_dir)


def test_missing_and_unexpected_tensors_are_named(checkpoints, tmp_path) -> None:
    model_dir = copy_of(checkpoints, "nemotron-h", tmp_path)
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    del tensors["backbone.layers.4.mixer.experts.3.up_proj.weight"]
    tensors["backbone.layers.0.mixer.extra"] = torch.zeros(3)
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError) as error:
        load_hf_model(model_dir)
    message = str(error.value)
    assert "missing tensors ['backbone.layers.4.mixer.experts.3.up_proj.weight']" in message
    assert "unexpected tensors ['backbone.layers.0.mixer.extra']" in message


def test_an_unsupported_architecture_is_refused_by_name(checkpoints, tmp_path) -> None:
    model_dir = copy_of(checkpoints, "bamba", tmp_path)
    edit_config(model_dir, architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(ValueError, match="'LlamaForCausalLM' is not supported") as error:
        load_spec(model_dir)
    assert all(name in str(error.value) for name in SUPPORTED)


@pytest.mark.parametrize(
    ("variant", "changes", "pattern"),
    [
        (
            "granite",
            {"num_key_value_heads": 3},
            "num_attention_heads 4 is not divisible by num_key_value_heads 3",
        ),
        (
            "granite",
            {"num_attention_heads": 5, "num_key_value_heads": 5},
            "hidden_size 32 is not divisible by num_attention_heads 5",
        ),
        ("nemotron-h", {"n_groups": 3}, "mamba_num_heads 8 is not divisible by n_groups 3"),
        ("bamba", {"mamba_n_heads": 7, "mamba_d_head": "auto"}, "mamba_n_heads must divide"),
        (
            "qwen3_5",
            {"linear_num_value_heads": 3},
            "linear_num_value_heads 3 is not divisible by linear_num_key_heads 2",
        ),
    ],
    ids=["kv-heads", "head-size", "mamba-groups", "mamba-heads", "deltanet-heads"],
)
def test_head_sizes_that_do_not_divide_are_named(
    checkpoints, tmp_path, variant, changes, pattern
) -> None:
    model_dir = copy_of(checkpoints, variant, tmp_path)
    edit_config(model_dir, **changes)
    with pytest.raises(ValueError, match=pattern):
        load_spec(model_dir)


def test_the_runner_fails_at_construction_before_serving(checkpoints, tmp_path) -> None:
    model_dir = copy_of(checkpoints, "bamba", tmp_path)
    (model_dir / "model.safetensors").unlink()
    config = ModelConfig(model_dir=str(model_dir), device="cpu")
    with pytest.raises(ValueError, match="no \\*.safetensors weights"):
        TorchRunner(CacheConfig(num_blocks=8, num_mamba_blocks=4), config)
