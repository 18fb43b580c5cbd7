"""What the bound under memory (`bound.py`) knows of each request before it runs: its hashes,
its attention blocks, and where its memory-free oracle hit reads and resumes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from engine.hashing import BlockHash, hash_prefix
from engine.traces.trace import TraceItem, TraceRequest
from workloads.oracle import oracle


class Block(NamedTuple):
    """One attention block of a request's sequence, named by the last unit hash it holds."""

    key: BlockHash
    unit_hashes: tuple[BlockHash, ...]  # the complete units inside it, in order


class Plan(NamedTuple):
    """What the bound knows of one request before it runs."""

    request: TraceRequest
    prompt_hashes: list[BlockHash]
    sequence_hashes: list[BlockHash]  # prompt, then output when given
    blocks: list[Block]
    num_transient: int  # in-flight blocks that hold no complete unit (outputs, short tails)
    num_oracle_tokens: int
    num_oracle_units: int  # the oracle hit in units
    needs: list[BlockHash]  # per block the oracle hit reads: the last unit hash it needs
    resume: BlockHash | None  # the state the oracle hit resumes at
    length: int  # the tokens it holds at most while in flight (prompt and max_tokens)

    def num_live_states(self, mamba_block_size: int | None) -> int:
        """The state slots its first chunk writes: one per `Bm` of its sequence past the whole
        `Bm` spans its oracle hit covers (the engine's aligned Mamba table leaves those empty),
        at least one; one when `Bm` is not given."""
        if not mamba_block_size:
            return 1
        spans = -(-self.length // mamba_block_size)
        return max(spans - self.num_oracle_tokens // mamba_block_size, 1)


def plan_requests(
    items: Iterable[TraceItem],
    unit: int,
    block_size: int,
    eagle: bool = False,
    outputs: Mapping[str, Sequence[int]] | None = None,
) -> list[Plan]:
    """Each request's hashes, blocks and oracle hit; pins are dropped."""
    if unit <= 0 or block_size % unit:
        raise ValueError(f"the match unit {unit} must be positive and divide Ba {block_size}")
    requests = [item for item in items if isinstance(item, TraceRequest)]
    best = oracle(requests, unit, eagle, outputs)
    per_block = block_size // unit
    plans = []
    for request, hit in zip(requests, best.hits, strict=True):
        sequence = list(request.token_ids)
        if outputs is not None and outputs.get(request.request_id):
            sequence += outputs[request.request_id]
        hashes = hash_prefix(sequence, unit, request.cache_salt)
        blocks = [
            Block(
                hashes[min(start + per_block, len(hashes)) - 1], tuple(hashes[start:][:per_block])
            )
            for start in range(0, len(hashes), per_block)
        ]
        length = max(len(sequence), len(request.token_ids) + request.max_tokens)
        num_needed = hit.num_oracle_tokens // unit + (1 if eagle and hit.num_oracle_tokens else 0)
        needs = [
            hashes[min(start + per_block, num_needed) - 1]
            for start in range(0, num_needed, per_block)
        ]
        plans.append(
            Plan(
                request,
                hashes[: len(request.token_ids) // unit],
                hashes,
                blocks,
                max(-(-length // block_size) - len(blocks), 0),
                hit.num_oracle_tokens,
                hit.num_oracle_tokens // unit,
                needs,
                hashes[hit.num_oracle_tokens // unit - 1] if hit.num_oracle_tokens else None,
                length,
            )
        )
    return plans
