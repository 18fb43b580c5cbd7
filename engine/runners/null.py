"""The `null` runner: no tensors, for geometry and hit-rate replays of prompts of any length.

Its "model" maps the last tokens of a request to the next one, so outputs depend only on the
tokens, never on the cache.
"""

from __future__ import annotations

import zlib
from array import array

from engine.cache.manager import BlockCopy
from engine.config import ModelConfig
from engine.runners.base import Runner
from engine.scheduling.outputs import RunnerOutput, ScheduledChunk

_CONTEXT = 64


def next_token(token_ids: list[int], end: int, vocab: int) -> int:
    window = array("I", token_ids[max(0, end - _CONTEXT) : end]).tobytes()
    return zlib.crc32(window, end) % vocab


class NullRunner(Runner):
    def __init__(self, model_config: ModelConfig) -> None:
        self.vocab = min(model_config.vocab_size, 256)

    def zero_blocks(self, group: str, block_ids: list[int]) -> None:
        return None

    def copy_block(self, copy: BlockCopy) -> None:
        return None

    def forward(self, chunks: list[ScheduledChunk]) -> RunnerOutput:
        return RunnerOutput(
            sampled={
                c.request_id: next_token(c.token_ids, c.end, self.vocab) for c in chunks if c.sample
            }
        )
