"""The `ledger` runner: no model, but a record of what every slot holds.

Each attention slot records the token id whose KV it would hold; each Mamba block records the
state it would hold as `(length, digest)`, where `digest` is a rolling hash of the tokens the
state absorbed, advanced from the state the step actually read. Every read is checked against
the reader's own prefix, so a wrong reuse, a missed copy or a copy run out of order raises
`LedgerMismatch` naming the request, group, block and position. Sampling depends only on the
state read, so cache-on and cache-off replays produce the same tokens exactly when every reuse
is right.
"""

from __future__ import annotations

import sys
from array import array

import numpy as np
import torch

from engine.cache.manager import BlockCopy
from engine.config import CacheConfig, ModelConfig
from engine.events import ATTENTION
from engine.runners.base import Runner, block_rows
from engine.scheduling.outputs import RunnerOutput, ScheduledChunk
from engine.tiers.moves import UnitLoad, UnitSave
from engine.tiers.unit import TierUnit

# The digest is the prefix read as digits of base 2**64 (one token a digit, first token most
# significant), modulo the Mersenne prime 2**89 - 1: Horner's rule, so absorbing `a` then `b`
# gives the state of absorbing `a + b` whatever the chunking, and distinct prefixes of one
# length are distinct numbers before the modulus.
_MOD_BITS = 89
_MOD = (1 << _MOD_BITS) - 1
_DIGIT_BITS = 64
_SHIFT_ONE = 1 << _DIGIT_BITS % _MOD_BITS  # the shift of one digit (a decode step's token)
EMPTY = -1
_HALF_BITS = 62  # a digest (< 2**89) saved to a tier as two int64 halves
_HALF_MASK = (1 << _HALF_BITS) - 1

MambaState = tuple[int, int]  # (tokens absorbed, rolling digest)


class LedgerMismatch(AssertionError):
    """A block held something other than what the reader's prefix says."""


def advance(state: MambaState, token_ids: list[int]) -> MambaState:
    length, digest = state
    if not token_ids:
        return state
    if len(token_ids) == 1 and 0 <= token_ids[0] < 1 << _DIGIT_BITS:  # one digit: no packing
        return length + 1, (digest * _SHIFT_ONE + token_ids[0]) % _MOD
    digits = array("Q", token_ids)
    if sys.byteorder == "little":
        digits.byteswap()
    tail = int.from_bytes(digits.tobytes(), "big")
    shift = 1 << (_DIGIT_BITS * len(token_ids)) % _MOD_BITS  # 2**(64 n) mod (2**89 - 1)
    return length + len(token_ids), (digest * shift + tail) % _MOD


class LedgerRunner(Runner):
    kind = "ledger"

    def __init__(self, cache_config: CacheConfig, model_config: ModelConfig) -> None:
        self.block_size = cache_config.attention_block_size
        self.attention = np.full((cache_config.num_blocks, self.block_size), EMPTY, np.int64)
        self.mamba: list[MambaState | None] = [None] * cache_config.mamba_num_blocks
        self.vocab = min(model_config.vocab_size, 256)
        self.num_checked_tokens = 0
        self.num_checked_states = 0
        # per request scheduled in the last step: the true state last checked, and its token
        # ids as an array grown by what it appended (a request that skips a step starts over)
        self._truth: dict[str, MambaState] = {}
        self._arrays: dict[str, np.ndarray] = {}

    def zero_blocks(self, group: str, block_ids: list[int]) -> None:
        if group == ATTENTION:
            self.attention[block_ids] = EMPTY
        else:
            for block_id in block_ids:
                self.mamba[block_id] = None

    def copy_block(self, copy: BlockCopy) -> None:
        if copy.group == ATTENTION:
            self.attention[copy.dst] = self.attention[copy.src]
        else:
            self.mamba[copy.dst] = self.mamba[copy.src]

    def _slots(self, table: np.ndarray, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        positions = np.arange(start, end)
        return table[positions // self.block_size], positions % self.block_size

    def _prefix_slots(
        self, chunk: ScheduledChunk, table: np.ndarray, end: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The table's blocks over [0, end) and what their slots hold there, in position order
        (whole rows gathered, then cut: a prefix starts at slot 0 of the table's first block).
        `table` is the chunk's attention block ids as an array."""
        num_rows = -(-end // self.block_size)
        if len(table) < num_rows:
            raise LedgerMismatch(
                f"request {chunk.request_id}: its table of {len(table)} "
                f"attention blocks does not reach position {end - 1}"
            )
        table = table[:num_rows]
        return table, self.attention[table].reshape(-1)[:end]

    def _token_array(self, chunk: ScheduledChunk) -> np.ndarray:
        """The request's token ids up to the chunk's end as an array, extended, not rebuilt."""
        array = self._arrays.get(chunk.request_id)
        if array is None or len(array) > chunk.end:
            array = np.asarray(chunk.token_ids[: chunk.end], dtype=np.int64)
        elif len(array) < chunk.end:
            tail = np.asarray(chunk.token_ids[len(array) : chunk.end], dtype=np.int64)
            array = np.concatenate((array, tail))
        return array

    def forward(self, chunks: list[ScheduledChunk]) -> RunnerOutput:
        sampled: dict[str, int] = {}
        arrays: dict[str, np.ndarray] = {}
        truth: dict[str, MambaState] = {}
        for chunk in chunks:
            arrays[chunk.request_id] = self._token_array(chunk)
        self._arrays = arrays
        for chunk in chunks:
            table = np.asarray(chunk.attention_block_ids, dtype=np.int64)
            state = self._read(chunk, table)
            truth[chunk.request_id] = self._truth[chunk.request_id]
            tokens = chunk.token_ids
            rows, cols = self._slots(table, chunk.start, chunk.end)
            self.attention[rows, cols] = arrays[chunk.request_id][chunk.start : chunk.end]
            position = chunk.start
            for target, block_id in chunk.mamba_writes:
                state = advance(state, tokens[position:target])
                position = target
                self.mamba[block_id] = state
            if position == chunk.end:  # advanced from the checked state: the truth at the end
                truth[chunk.request_id] = state
            if chunk.sample:
                sampled[chunk.request_id] = state[1] % self.vocab
        self._truth = truth
        return RunnerOutput(sampled=sampled)

    def _read(self, chunk: ScheduledChunk, table: np.ndarray) -> MambaState:
        """Check every cached token and the Mamba state the chunk starts from."""
        start, tokens = chunk.start, chunk.token_ids
        if start:
            table, held = self._prefix_slots(chunk, table, start)
            expected = self._arrays[chunk.request_id][:start]
            wrong = np.flatnonzero(held != expected)
            if wrong.size:
                p = int(wrong[0])
                raise LedgerMismatch(
                    f"request {chunk.request_id}: attention block "
                    f"{int(table[p // self.block_size])} holds token {int(held[p])} at "
                    f"position {p}, its prefix says {int(expected[p])}"
                )
            self.num_checked_tokens += start
        known = self._truth.get(chunk.request_id, (0, 0))
        if known[0] > start:
            known = (0, 0)  # resumed from an earlier position (preempted): start over
        expected_state = advance(known, tokens[known[0] : start])
        self._truth[chunk.request_id] = expected_state
        if chunk.mamba_read_block is None:
            found = (0, 0) if start == 0 else None
        else:
            found = self.mamba[chunk.mamba_read_block]
        if found != expected_state:
            raise LedgerMismatch(
                f"request {chunk.request_id}: mamba block {chunk.mamba_read_block} holds a state "
                f"of {found[0] if found else None} tokens that is not the state of its "
                f"{start}-token prefix"
            )
        self.num_checked_states += 1
        return found

    # ------------------------------------------------------------------ tiers
    def save_unit(self, save: UnitSave) -> TierUnit:
        """The token ids the blocks hold over `[start, end)` and the state `(length, digest)`
        (the digest in two int64 halves); a state that is not after `end` tokens raises."""
        blocks = tuple(
            {"tokens": torch.from_numpy(self.attention[block_id, low:high].copy())}
            for block_id, low, high in block_rows(
                save.attention_block_ids, self.block_size, save.start, save.end
            )
        )
        state = self.mamba[save.state_block]
        if state is None or state[0] != save.end:
            raise LedgerMismatch(
                f"save of unit {save.key.hex()}: mamba block {save.state_block} holds a state "
                f"of {None if state is None else state[0]} tokens, not {save.end}"
            )
        length, digest = state
        halves = torch.tensor([length, digest & _HALF_MASK, digest >> _HALF_BITS])
        return TierUnit(save.key, save.parent, save.start, save.end, blocks, {"state": halves})

    def load_unit(self, load: UnitLoad) -> None:
        table = np.asarray(load.attention_block_ids, dtype=np.int64)
        for unit in load.units:
            tokens = np.concatenate([block["tokens"].numpy() for block in unit.blocks])
            low = max(load.start, unit.start)
            if low < unit.end:
                rows, cols = self._slots(table, low, unit.end)
                self.attention[rows, cols] = tokens[low - unit.start :]
        length, low_half, high_half = (int(x) for x in load.units[-1].state["state"])
        self.mamba[load.state_block] = (length, (high_half << _HALF_BITS) | low_half)

    # ------------------------------------------------------------------ audits
    def attention_holds(self, block_id: int, block_start: int, token_ids: list[int]) -> bool:
        """Whether the block holds `token_ids` from its first slot (an entry's valid span)."""
        del block_start
        held = self.attention[block_id, : len(token_ids)]
        return bool(np.array_equal(held, np.asarray(token_ids, dtype=np.int64)))

    def mamba_holds(self, block_id: int, token_ids: list[int]) -> bool:
        """Whether the block holds the state after exactly `token_ids`."""
        return self.mamba[block_id] == advance((0, 0), token_ids)
