"""The `null` runner: no tensors, for geometry and hit-rate replays of prompts of any length.

Its "model" maps the last tokens of a request to the next one, so outputs depend only on the
tokens, never on the cache. A unit it saves to the tiers carries no values but the model's bytes:
each payload is one byte seen as many (an expanded tensor), so a tier counts what the unit
would take for the model's footprint (`engine.setup.footprint`) without holding it.
"""

from __future__ import annotations

import zlib
from array import array

import torch

from engine.cache.manager import BlockCopy
from engine.config import ModelConfig
from engine.runners.base import Runner
from engine.scheduling.outputs import RunnerOutput, ScheduledChunk
from engine.tiers.moves import UnitLoad, UnitSave
from engine.tiers.unit import TierUnit

_CONTEXT = 64


def next_token(token_ids: list[int], end: int, vocab: int) -> int:
    window = array("I", token_ids[max(0, end - _CONTEXT) : end]).tobytes()
    return zlib.crc32(window, end) % vocab


_ONE_BYTE = torch.zeros(1, dtype=torch.uint8)
#: each model config's (by its repr) bytes per token of attention and per state
_UNIT_BYTES: dict[str, tuple[int, int]] = {}


def sized(num_bytes: int) -> torch.Tensor:
    """A tensor of `num_bytes` bytes by its shape that holds one (never written)."""
    return _ONE_BYTE.expand(max(num_bytes, 1))


class NullRunner(Runner):
    kind = "null"

    def __init__(self, model_config: ModelConfig, block_size: int = 16) -> None:
        self.vocab = min(model_config.vocab_size, 256)
        self.model_config = model_config
        self.block_size = block_size
        self._bytes: tuple[int, int] | None = None  # per token of attention, per state

    def unit_bytes(self) -> tuple[int, int]:
        """The model's bytes per token of attention and per state, read once a process for
        each model config (the built-in model's footprint builds the model)."""
        if self._bytes is None:
            key = repr(self.model_config)
            if key not in _UNIT_BYTES:
                from engine.setup.footprint import footprint

                found = footprint(self.model_config)
                _UNIT_BYTES[key] = found.attention_bytes_per_token, found.mamba_bytes_per_slot
            self._bytes = _UNIT_BYTES[key]
        return self._bytes

    def zero_blocks(self, group: str, block_ids: list[int]) -> None:
        return None

    def copy_block(self, copy: BlockCopy) -> None:
        return None

    def save_unit(self, save: UnitSave) -> TierUnit:
        per_token, per_state = self.unit_bytes()
        blocks = ({"kv": sized((save.end - save.start) * per_token)},)  # all rows as one
        return TierUnit(
            save.key, save.parent, save.start, save.end, blocks, {"state": sized(per_state)}
        )

    def load_unit(self, load: UnitLoad) -> None:
        return None

    def forward(self, chunks: list[ScheduledChunk]) -> RunnerOutput:
        return RunnerOutput(
            sampled={
                c.request_id: next_token(c.token_ids, c.end, self.vocab) for c in chunks if c.sample
            }
        )
