"""A request as the scheduler sees it: tokens, progress, tables' bookkeeping and its record."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from engine.cache.entry import CheckpointReason
from engine.hashing import BlockHash, extend_hashes


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class CowCopy(NamedTuple):
    """A copy-on-write block copy queued for a request, as its record keeps it."""

    group: str
    path: str  # "consumer": shared -> private; "producer": live -> cache-owned
    src: int
    dst: int
    position: int  # the checkpoint position the copied state holds
    step: int  # the step whose forward the copy runs ahead of

    def to_dict(self) -> dict[str, str | int]:
        """The copy as replay records and completions spell it."""
        return self._asdict()


class AdmissionMatch(NamedTuple):
    """What a request's first admission saw of its prefix (miss attribution, `MatchStop`)."""

    proof_length: int = 0  # the attention match before the EAGLE drop
    proof_limit: int = 0  # the most the proof could reach (P - 1, EAGLE: one unit more), floored
    in_flight: int = 0  # how far a request in flight beside it was computing its prefix


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    unit: int
    cache_salt: str | None = None
    pin_id: str | None = None  # set for a pin's materialization: no logits, no output
    # where the prompt's rendered chat messages end: message checkpoints (docs/rules.md section 5)
    checkpoint_offsets: tuple[int, ...] = ()
    arrival_ts: float = field(default_factory=time.time)

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_registered_tokens: int = 0  # attention keys exist up to here
    prefill_target: int = 0  # tokens to prefill since the last admission
    targets: dict[int, CheckpointReason] = field(default_factory=dict)
    # states the Mamba pool's policy would not have written (section 5: admission)
    refused_states: frozenset[int] = frozenset()
    is_observed: bool = False  # its prompt's chain was shown to the eviction policies
    # where its prompt branched off earlier ones that went on, as learnt then (a state there
    # serves the siblings that follow; docs/rules.md section 5); None: nowhere known
    branch_point: int | None = None
    block_hashes: list[BlockHash] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)

    # the record replay and RequestFinished report
    num_cached_tokens: int | None = None
    hit_tokens_by_group: dict[str, int] = field(default_factory=dict)
    # tokens of its hits that the tiers below the device served (loaded, not computed)
    num_loaded_tokens: int = 0
    # the tokens of its hit (`num_cached_tokens`) past the device's own, by the farthest tier
    # the load read from: {"host": n} or {"disk": n} (empty: the device served it all)
    hit_tokens_by_medium: dict[str, int] = field(default_factory=dict)
    num_prefill_computed: int = 0
    chunks: list[tuple[int, int]] = field(default_factory=list)
    chunk_stop_reasons: list[str] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    cow_copies: list[CowCopy] = field(default_factory=list)
    num_preemptions: int = 0
    num_wait_steps: int = 0  # steps spent waiting for a request in flight to compute its prefix
    num_copy_wait_steps: int = 0  # steps spent waiting for its checkpoint's copy to run
    arrival_index: int = 0  # its place in the scheduler's arrival order
    arrival_step: int = 0  # the engine's step count when it arrived (a what-if replays it there)
    match: AdmissionMatch = AdmissionMatch()  # what its first admission saw
    pin_hits: dict[str, int] = field(default_factory=dict)  # pin id -> boundary the hit covered
    first_token_ts: float | None = None
    finished_ts: float | None = None
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        bad = [p for p in self.checkpoint_offsets if not 0 < p <= len(self.prompt_token_ids)]
        if bad:
            raise ValueError(
                f"request {self.request_id!r}: checkpoint_offsets must lie in (0, "
                f"{len(self.prompt_token_ids)}] (the prompt length), got {bad[:5]}"
            )
        self.checkpoint_offsets = tuple(self.checkpoint_offsets)
        self.all_token_ids = list(self.prompt_token_ids)
        extend_hashes(self.block_hashes, self.all_token_ids, self.unit, self.cache_salt)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def is_pin(self) -> bool:
        return self.pin_id is not None

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.prefill_target

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_ts is None:
            return None
        return self.first_token_ts - self.arrival_ts

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        extend_hashes(self.block_hashes, self.all_token_ids, self.unit, self.cache_salt)
