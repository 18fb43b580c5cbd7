"""What would keep a Mamba state at a suggested junction of a vLLM or SGLang engine
(`api.peers.analysis` finds them): Junction's engine, and vLLM's own options, as vLLM 0.33's
`vllm/config/cache.py` and its hybrid-model config describe them.

- With prefix caching on, vLLM's Mamba cache runs "align": states only at block boundaries, and
  the Mamba block is set to the attention block (`--block-size`), which it raises to the
  model's minimum (an attention page must hold a Mamba state) and keeps a multiple of the
  attention backend's kernel block (16 for FlashAttention, assumed here). `--mamba-cache-mode`
  is deprecated and does nothing.
- `--prefix-cache-retention-interval 0` (the default) keeps only the "semantic" states: the
  replay boundary and the block-floored shared-prefix junction it observes.
- `--enable-mamba-shared-prefix-checkpoint` keeps the junction itself, floored to
  `--prefix-match-unit`, but only with EAGLE/MTP drafts and a match unit below the Mamba block.
"""

from __future__ import annotations

from typing import NamedTuple

#: vLLM's attention block sizes are multiples of this (its default block size, and the
#: smallest kernel block of its attention backends).
VLLM_BLOCK_ALIGNMENT = 16
JUNCTION_UNIT = 16  # `junction serve`'s default match unit U (its attention block, 16)


class PeerRemedy(NamedTuple):
    """One way to keep a state at (or just below) a suggested junction."""

    engine: str  # "junction", "vllm" or "sglang": whose option it is
    flags: str  # the command line's options
    state_at: int  # where the state would be kept
    tokens_saved: int  # per request, against the nearest state now
    text: str  # markdown: what it does, plainly


def peer_remedies(
    position: int, state: int, kind: str, attention_block: int, state_block: int, unit: int | None
) -> tuple[PeerRemedy, ...]:
    """What keeps a state at `position` (the nearest held now: `state`): Junction's engine,
    and for vLLM its block size and shared-prefix checkpoint (`vllm/config/cache.py`)."""
    at = position // JUNCTION_UNIT * JUNCTION_UNIT
    found = [
        PeerRemedy(
            "junction",
            "junction serve --model MODEL",
            at,
            at - state,
            f"its junction checkpoint keeps the state where a request leaves the cached prefix, "
            f"at the match unit U = {JUNCTION_UNIT}: position **{at:,}**, so each request "
            f"through it computes {at - state:,} fewer tokens.",
        )
    ]
    if kind == "vllm":
        found += _vllm_remedies(position, state, state_block, unit)
    return tuple(r for r in found if r.tokens_saved > 0)


def _vllm_remedies(
    position: int, state: int, state_block: int, unit: int | None
) -> list[PeerRemedy]:
    now = position // state_block * state_block
    size = vllm_block_size(position, state_block)
    at = position // size * size
    caveat = (
        f" It is below this engine's {state_block:,}-token blocks: vLLM raises a block size "
        "below the model's minimum (an attention page must hold a Mamba state) and says so in "
        'its log ("Setting attention block size to ..."): check it there.'
        if size < state_block
        else ""
    )
    grid = (
        f"with prefix caching on, vLLM keeps Mamba states only on its block grid (it makes "
        f"the Mamba block the attention block; this engine's Mamba blocks are "
        f"{state_block:,} tokens)"
    )
    keeps = (
        "vLLM keeps the state at such a block-floored junction once a request that shares the "
        "prefix reaches it (`--prefix-cache-retention-interval 0`, its default, keeps junctions)"
    )
    if size == state_block:
        text = f"{grid}: the nearest boundary is **{now:,}**, and {keeps}; none is held now."
        flags = f"vllm serve MODEL --block-size {size} (as now)"
    else:
        text = (
            f"{grid}: the nearest boundary now is {now:,}. A {size:,}-token block puts one at "
            f"**{at:,}**{' exactly' if at == position else ''}, and {keeps}.{caveat}"
        )
        flags = f"vllm serve MODEL --block-size {size}"
    found = [PeerRemedy("vllm", flags, at, at - state, text)]
    match_unit = unit if unit and unit < state_block else VLLM_BLOCK_ALIGNMENT
    exact = position // match_unit * match_unit
    found.append(
        PeerRemedy(
            "vllm",
            f"vllm serve MODEL --prefix-match-unit {match_unit} "
            "--enable-mamba-shared-prefix-checkpoint",
            exact,
            exact - state,
            f"keeps the state at the junction itself, floored to the match unit: **{exact:,}**. "
            "Only with EAGLE/MTP speculative decoding: without drafts vLLM ignores the flag.",
        )
    )
    return found


def vllm_block_size(position: int, current: int, alignment: int = VLLM_BLOCK_ALIGNMENT) -> int:
    """The vLLM block size whose grid puts a boundary at `position`, or closest below: among
    multiples of `alignment` from `current` up to 4 times it (no smaller than the model may
    need), the one closest under `position`, then the smallest; below `current` only when
    `position` is (then the largest multiple of `alignment` that divides it)."""
    if position < current:
        sizes = range(alignment, position + 1, alignment)
        exact = [s for s in sizes if position % s == 0]
        return exact[-1] if exact else max(alignment, position // alignment * alignment)
    first = -(-current // alignment) * alignment
    sizes = range(first, min(4 * current, position) + 1, alignment)
    return min(sizes, key=lambda s: (position - position // s * s, s), default=first)
