"""A Hugging Face checkpoint's config.json, read into the spec Junction sizes its caches by.

What differs between architectures (where the state's shape is kept, the feed-forwards, a
multimodal wrapper) is their entry in `engine.model.hf.architectures.ARCHITECTURES`.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.model.hf.architectures import ARCHITECTURES, SUPPORTED, Architecture
from engine.model.hf.spec import HFModelSpec
from engine.model.hf.state_shapes import GDNStateShape, MambaStateShape

#: transformers' layer type names -> Junction's; "mamba" and "linear" layers hold a state slot.
#: Nemotron-H names its Mamba-2 layers linear_attention too; in Qwen they are Gated DeltaNet.
LAYER_KINDS = {
    "full_attention": "attention",
    "attention": "attention",
    "linear_attention": "mamba",
    "mamba": "mamba",
    "mlp": "mlp",
    "moe": "moe",
}


def read_architecture(model_dir: Path) -> str:
    """`architectures[0]` of config.json; a ValueError unless Junction supports it."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no config.json: pass a Hugging Face model directory")
    architectures = json.loads(path.read_text()).get("architectures") or []
    architecture = architectures[0] if architectures else None
    if architecture not in SUPPORTED:
        raise ValueError(
            f"{path}: architecture {architecture!r} is not supported; "
            f"supported architectures: {', '.join(SUPPORTED)}"
        )
    return architecture


def _require_divisible(
    path: Path, what: str, dividend: tuple[str, int], divisor: tuple[str, int]
) -> None:
    """(name, value) pairs as config.json names them; a ValueError unless divisor | dividend."""
    (dividend_name, a), (divisor_name, b) = dividend, divisor
    if a <= 0 or b <= 0 or a % b:
        raise ValueError(
            f"{path}: {what}: {dividend_name} {a} is not divisible by {divisor_name} {b}"
        )


def load_spec(model_dir: Path) -> HFModelSpec:
    """Read and check `model_dir/config.json`. Loads no weights."""
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    architecture = read_architecture(model_dir)
    entry = ARCHITECTURES[architecture]
    path = model_dir / "config.json"
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as error:  # transformers' own checks of the config, with the file named
        raise ValueError(f"{path}: {error}") from error
    tied = bool(getattr(config, "tie_word_embeddings", False))
    prefix, ignored = "model", ()
    if entry.multimodal:  # the language model, text only
        config = config.text_config
        prefix, ignored = "model.language_model", (r"^model\.visual\.",)
    head_dim = _head_dim(path, config)
    mamba = _state_shape(path, entry, config)
    unknown = sorted(set(config.layer_types) - LAYER_KINDS.keys())
    if unknown:
        raise ValueError(f"{path}: unknown layer types {unknown}")
    return HFModelSpec(
        model_dir=model_dir,
        architecture=architecture,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        layer_kinds=tuple(
            entry.state.kind if kind == "mamba" else kind
            for kind in (LAYER_KINDS[t] for t in config.layer_types)
        ),
        ffn_kind=_ffn_kind(entry, config),
        num_attention_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=head_dim,
        mamba=mamba,
        dtype=str(getattr(config, "dtype", None) or "float32").removeprefix("torch."),
        hf_config=config,
        weights_prefix=prefix,
        ignored=ignored,
        tie_word_embeddings=tied,
    )


def _head_dim(path: Path, config) -> int:
    """The attention head size, given or hidden / heads; the KV heads must group the heads."""
    hidden = config.hidden_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None)
    if not head_dim:
        what = "attention head size"
        _require_divisible(path, what, ("hidden_size", hidden), ("num_attention_heads", heads))
        head_dim = hidden // heads
    what = "grouped KV heads"
    _require_divisible(
        path, what, ("num_attention_heads", heads), ("num_key_value_heads", kv_heads)
    )
    return head_dim


def _state_shape(path: Path, entry: Architecture, config) -> MambaStateShape | GDNStateShape:
    # transformers has checked that the Mamba heads tile the inner width; not the groups
    fields = entry.state
    shape = fields.shape(*(getattr(config, name) for name in fields.fields))
    (dividend, divisor), what = fields.divides, fields.what
    _require_divisible(
        path, what, (dividend, getattr(config, dividend)), (divisor, getattr(config, divisor))
    )
    return shape


def _ffn_kind(entry: Architecture, config) -> str | None:
    """Each layer's feed-forward: "mlp", "moe", or None where they are layers of their own."""
    if entry.ffn != "mlp_or_moe":
        return entry.ffn
    experts = getattr(config, "num_experts", 0) or getattr(config, "num_local_experts", 0) or 0
    return "moe" if experts > 0 else "mlp"
