"""Whether a request can ever run here: its tokens against `max_model_len`, and the most blocks
it may hold at once against what each pool has unpinned. A request that fails is refused when
it is added, rather than admitted and then refused for `capacity` on an idle engine.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.cache.block_pool import BlockPool
from engine.config import CacheConfig
from engine.events import ATTENTION, MAMBA
from engine.request import Request

# Blocks a request may hold at once beyond one table slot per block of its tokens.
# Attention: the shared source of its consumer copy (a hit ending inside a block), held until
# the copy has run.
ATTENTION_EXTRA_BLOCKS = 1
# Mamba, within one step: the other end of its one copy-on-write (a consumer's shared source,
# or a producer's cache-owned copy: a step moves only the slot its chunk starts in), plus the
# cache-owned blocks of the inline checkpoints inside one chunk that are not block boundaries:
# the resend `c`, the extension `e` and the junction `j` (its block floor is a boundary).
# Interval states take none: they are written only into spare free blocks. A pinned boundary
# inside the prompt is one more cache-owned block, counted per pin by `blocks_needed`.
# Not counted: message checkpoints and the junctions kept for waiting siblings or waiters on
# a producer; a request that needs more than this passes here and is refused for `capacity`
# when it cannot be admitted to an idle engine.
MAMBA_EXTRA_BLOCKS = 1 + 3


def blocks_needed(num_tokens: int, config: CacheConfig, num_pins: int) -> dict[str, int]:
    """The most blocks per group a request of `num_tokens` (prompt + output) may hold at once;
    `num_pins` counts every pin listed, an upper bound on the pinned boundaries it keeps."""
    return {
        ATTENTION: -(-num_tokens // config.attention_block_size) + ATTENTION_EXTRA_BLOCKS,
        MAMBA: -(-num_tokens // config.mamba_block_size) + MAMBA_EXTRA_BLOCKS + num_pins,
    }


def check_fits(
    request: Request,
    config: CacheConfig,
    max_model_len: int,
    pools: Mapping[str, BlockPool],
    num_pins: int,
) -> None:
    """Raise `ValueError` when `request` could not run even on an otherwise empty engine."""
    total = request.num_prompt_tokens + request.sampling.max_tokens
    if total > max_model_len:
        raise ValueError(
            f"request {request.request_id!r} has {total} prompt + output tokens; "
            f"max_model_len is {max_model_len}"
        )
    needs = blocks_needed(total, config, num_pins)
    for group, pool in pools.items():
        usable = pool.num_blocks - pool.num_pinned
        if needs[group] > usable:
            raise ValueError(
                f"request {request.request_id!r} ({total} tokens) may need {needs[group]} "
                f"{group} blocks of {pool.block_size} tokens, but the pool has {usable} "
                f"unpinned of {pool.num_blocks}: raise the number of blocks"
            )


def max_request_tokens(
    config: CacheConfig, max_model_len: int, pools: Mapping[str, BlockPool], num_pins: int
) -> int:
    """The most prompt + output tokens `check_fits` lets one request hold (what a router
    checks before it picks an engine)."""
    sizes = {ATTENTION: config.attention_block_size, MAMBA: config.mamba_block_size}
    extra = {ATTENTION: ATTENTION_EXTRA_BLOCKS, MAMBA: MAMBA_EXTRA_BLOCKS + num_pins}
    most = max_model_len
    for group, pool in pools.items():
        usable = pool.num_blocks - pool.num_pinned - extra[group]
        most = min(most, max(usable, 0) * sizes[group])
    return most
