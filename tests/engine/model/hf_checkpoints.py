"""Small random Hugging Face checkpoints of each architecture the engine loads, for the tests.

`build_checkpoint(arch, path)` builds the model with transformers at the smallest shapes that
still take every loader path (groups, experts, tied heads) and writes it with its tokenizer
(`engine.model.hf.synthetic`). The weights are random (seeded), large enough that greedy text
is not degenerate.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import (
    BambaConfig,
    BambaForCausalLM,
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    PreTrainedModel,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

from engine.model.hf.synthetic import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, write_checkpoint

ARCHITECTURES = (
    "BambaForCausalLM",
    "GraniteMoeHybridForCausalLM",
    "NemotronHForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration",
)
# hidden 32; 2 attention and 2 Mamba layers at least; Mamba: 8 heads of 8, 2 groups, state 8
COMMON = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "pad_token_id": PAD_ID,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "initializer_range": 0.2,
}
# Qwen: 3 Gated DeltaNet and 2 attention layers; DeltaNet 2 key heads shared by 4 value heads.
# Weights at std 0.1, not COMMON's 0.2: at 0.2 the random delta rule amplifies float32 rounding
# until two exact orders of the same sums (transformers' chunked rule and a token-by-token
# recurrence) differ by 1.5e-5 at one layer's output and 1.5e-4 in the logits; at 0.1 they
# differ by 9e-6 in the logits, and greedy text stays varied.
QWEN = {
    **COMMON,
    "initializer_range": 0.1,
    "head_dim": 16,
    "num_hidden_layers": 5,
    "layer_types": [
        "linear_attention",
        "full_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
    ],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
}
QWEN_EXPERTS = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 40,
}


def qwen3_5(moe: bool) -> PreTrainedModel:
    if moe:
        config = Qwen3_5MoeTextConfig(**QWEN, **QWEN_EXPERTS, tie_word_embeddings=False)
        return Qwen3_5MoeForCausalLM(config)
    config = Qwen3_5TextConfig(**QWEN, intermediate_size=48, tie_word_embeddings=True)
    return Qwen3_5ForCausalLM(config)


def qwen3_5_multimodal(moe: bool) -> PreTrainedModel:
    """Qwen3.5 as published: the language model of `qwen3_5` beside a one-block vision tower."""
    text = {**QWEN, "intermediate_size": 48, "tie_word_embeddings": False}
    vision = {
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_heads": 2,
        "out_hidden_size": 32,
        "patch_size": 4,
        "temporal_patch_size": 1,
        "spatial_merge_size": 1,
    }
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    return Qwen3_5ForConditionalGeneration(config)


def qwen3_next(moe: bool) -> PreTrainedModel:
    """MoE in every layer but layer 1 (a dense MLP), top-k weights not renormalised."""
    config = Qwen3NextConfig(
        **QWEN,
        **QWEN_EXPERTS,
        intermediate_size=48,
        mlp_only_layers=[1],
        norm_topk_prob=False,
        tie_word_embeddings=False,
    )
    return Qwen3NextForCausalLM(config)


def bamba(moe: bool) -> PreTrainedModel:
    config = BambaConfig(
        **COMMON,
        tie_word_embeddings=False,
        intermediate_size=48,
        num_hidden_layers=5,
        attn_layer_indices=[1, 4],
        mamba_n_heads=8,
        mamba_n_groups=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_chunk_size=16,
    )
    return BambaForCausalLM(config)


def granite(moe: bool) -> PreTrainedModel:
    config = GraniteMoeHybridConfig(
        **COMMON,
        tie_word_embeddings=not moe,  # Granite 4.0 ties its head; the MoE variant does not
        intermediate_size=24,
        shared_intermediate_size=40,
        num_local_experts=4 if moe else 0,
        num_experts_per_tok=2,
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "attention"],
        mamba_n_heads=8,
        mamba_n_groups=2,
        mamba_d_state=8,
        mamba_chunk_size=16,
        position_embedding_type="rope",
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
        logits_scaling=1.5,
    )
    return GraniteMoeHybridForCausalLM(config)


def nemotron_h(moe: bool) -> PreTrainedModel:
    config = NemotronHConfig(
        **COMMON,
        tie_word_embeddings=False,
        hybrid_override_pattern="M-M*E-*E",
        head_dim=16,  # not hidden / heads: Nemotron-H sets it apart
        intermediate_size=48,
        mamba_num_heads=8,
        mamba_head_dim=8,
        n_groups=2,
        ssm_state_size=8,
        chunk_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        moe_shared_expert_intermediate_size=40,
    )
    return NemotronHForCausalLM(config)


BUILDERS = {
    "BambaForCausalLM": bamba,
    "GraniteMoeHybridForCausalLM": granite,
    "NemotronHForCausalLM": nemotron_h,
    "Qwen3_5ForCausalLM": qwen3_5,
    "Qwen3_5MoeForCausalLM": lambda moe: qwen3_5(True),
    "Qwen3NextForCausalLM": qwen3_next,
    "Qwen3_5ForConditionalGeneration": qwen3_5_multimodal,
}


def build_checkpoint(arch: str, path: Path, *, moe: bool = False, seed: int = 0) -> Path:
    """A random `arch` checkpoint with a tokenizer in `path`; `moe` gives Granite experts
    (Nemotron-H always has its E layers)."""
    torch.manual_seed(seed)
    return write_checkpoint(BUILDERS[arch](moe), path)


#: the variants the tests run on, by id: (architecture, moe)
VARIANTS = {
    "bamba": ("BambaForCausalLM", False),
    "granite": ("GraniteMoeHybridForCausalLM", False),
    "granite-moe": ("GraniteMoeHybridForCausalLM", True),
    "nemotron-h": ("NemotronHForCausalLM", False),
    "qwen3_5": ("Qwen3_5ForCausalLM", False),
    "qwen3_5-moe": ("Qwen3_5MoeForCausalLM", True),
    "qwen3-next": ("Qwen3NextForCausalLM", True),
}


class CheckpointCache:
    """Builds each variant once, on first use, under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.built: dict[str, Path] = {}

    def get(self, variant: str) -> Path:
        if variant not in self.built:
            arch, moe = VARIANTS[variant]
            self.built[variant] = build_checkpoint(arch, self.root / variant, moe=moe)
        return self.built[variant]


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and on a shared machine a second thread
    that is descheduled stalls every op (an order of magnitude here), so tests run on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
