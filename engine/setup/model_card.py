"""What an engine says of its model: the name, where it comes from, its architecture and the
cache's size (its pools in blocks, and the bytes of each block). `junction serve` prints it at
start; `/v1/models` and the hello's free-form `model` carry it. The hello's `geometry` (the
typed `engine.geometry.CacheGeometry`) is another thing: the cache's block sizes and hit rules."""

from __future__ import annotations

from engine.config import CacheConfig, ModelConfig
from engine.setup.footprint import footprint


def model_card(model: ModelConfig, cache: CacheConfig) -> dict:
    """Plain JSON, so the hello's free-form `model` field holds it."""
    cost = footprint(model)
    block_bytes = cost.attention_bytes_per_token * cache.attention_block_size
    slot_bytes = cost.mamba_bytes_per_slot
    return {
        "name": model.name,
        "source": model.model_dir or "built-in (random weights)",
        "architecture": cost.architecture,
        "dtype": model.dtype,
        "num_attention_layers": cost.num_attention_layers,
        "num_mamba_layers": cost.num_mamba_layers,
        # what the `mamba` group holds: "mamba" (Mamba-2) or "linear" (Gated DeltaNet)
        "state_group": cost.state_kind,
        "weights_bytes": cost.weights_bytes,
        # the cache's size; the key stays "geometry" (`/v1/models` and stored hellos carry it)
        "geometry": {
            "attention_block_size": cache.attention_block_size,
            "num_blocks": cache.num_blocks,
            "attention_bytes_per_block": block_bytes,
            "mamba_block_size": cache.mamba_block_size,
            "num_mamba_blocks": cache.mamba_num_blocks,
            "mamba_bytes_per_slot": slot_bytes,
            "cache_bytes": cache.num_blocks * block_bytes + cache.mamba_num_blocks * slot_bytes,
        },
    }


#: the layers behind each kind of state group, as the start-up line names them
STATE_LAYERS = {"mamba": "Mamba", "linear": "Gated DeltaNet"}


def human(num_bytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= size:
            return f"{num_bytes / size:.1f} {unit}"
    return f"{num_bytes} B"


def describe(card: dict) -> str:
    """The card as the line `junction serve` prints at start."""
    size = card["geometry"]  # the cache's size (see `model_card`)
    layers = STATE_LAYERS.get(card.get("state_group", "mamba"), "state")
    return (
        f"model {card['name']} ({card['architecture']}, {card['num_attention_layers']} attention "
        f"+ {card['num_mamba_layers']} {layers} layers, {card['dtype']}, from {card['source']}); "
        f"cache {human(size['cache_bytes'])}: {size['num_blocks']} attention blocks of "
        f"{size['attention_block_size']} tokens ({human(size['attention_bytes_per_block'])} "
        f"each), {size['num_mamba_blocks']} {layers} state slots "
        f"({human(size['mamba_bytes_per_slot'])} each)"
    )
