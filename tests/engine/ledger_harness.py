"""Drive an engine over a request list with every check the ledger allows after each step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import CacheConfig
from engine.engine import Engine
from engine.hashing import BlockHash, hash_prefix
from engine.request import Request, SamplingParams


@dataclass
class Submission:
    token_ids: list[int]
    max_tokens: int = 1
    extends_previous: bool = False  # prompt = previous request's prompt + output + token_ids
    pin: bool = False
    unpin: bool = False  # release the latest pin still active (token_ids unused)
    abort_after: int | None = None  # run this many steps, then abort the oldest in flight


@dataclass
class Harness:
    engine: Engine
    concurrency: int = 1
    max_steps: int = 20_000
    audit_entries: bool = True
    on_step: Callable[[Engine], None] | None = None
    drain_for_pins: bool = True  # False: pins are made and released while requests run
    finished: list[Request] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    pinned_prefixes: list[list[int]] = field(default_factory=list)
    _keys: dict[BlockHash, tuple[list[int], int]] = field(default_factory=dict)
    num_steps: int = 0
    aborted_ids: set[str] = field(default_factory=set)
    # what a trace reached: pins made / released with requests in flight, running aborts
    num_pins_while_running: int = 0
    num_unpins_while_running: int = 0
    num_running_aborts: int = 0

    def run(self, submissions: list[Submission]) -> list[Request]:
        for sub in submissions:
            if sub.unpin:
                self._unpin()
                continue
            if sub.abort_after is not None:
                self._abort(sub.abort_after)
                continue
            if sub.pin:
                if self.drain_for_pins:
                    self._drain(0)
                elif self._in_flight():
                    self.num_pins_while_running += 1
                alignment = self.engine.cache_config.hit_alignment
                if len(sub.token_ids) < alignment:
                    try:
                        self.engine.pin("too-short", sub.token_ids)
                    except ValueError as exc:
                        assert "boundary of 0" in str(exc)
                        continue
                    raise AssertionError("a pin shorter than the hit grid was accepted")
                self.pinned_prefixes.append(sub.token_ids)
                self._learn(sub.token_ids)
                self.engine.pin(f"pin-{len(self.pinned_prefixes)}", sub.token_ids)
                if self.drain_for_pins:
                    self._drain(0)
                self.check()
                continue
            self._drain(self.concurrency - 1)
            tokens = sub.token_ids
            if sub.extends_previous and self.requests:
                last = self.requests[-1]
                while last.finish_reason is None:  # the next turn needs the whole answer
                    self._step()
                tokens = last.all_token_ids + tokens
            request = self.engine.add_request(tokens, SamplingParams(max_tokens=sub.max_tokens))
            self.requests.append(request)
        self._drain(0)
        return self.requests

    def _unpin(self) -> None:
        active = [p for p in self.engine.pins.values() if p.is_active]
        if not active:
            return
        self.num_unpins_while_running += self.engine.has_unfinished()
        self.engine.unpin(active[-1].pin_id)
        self.check()

    def _abort(self, num_steps: int) -> None:
        for _ in range(num_steps):
            if self.engine.has_unfinished():
                self._step()
        in_flight = [r for r in self.requests if r.finish_reason is None]
        if not in_flight:
            return
        victim = in_flight[0]
        self.num_running_aborts += victim.status.value == "running"
        self.aborted_ids.add(victim.request_id)
        self.engine.abort(victim.request_id)
        self.check()

    def _drain(self, limit: int) -> None:
        while self._in_flight() > limit or (limit == 0 and self.engine.has_unfinished()):
            self._step()

    def _step(self) -> None:
        self.finished.extend(self.engine.step())
        self.num_steps += 1
        if self.num_steps > self.max_steps:
            raise AssertionError(f"no progress after {self.max_steps} steps")
        if self.on_step is not None:
            self.on_step(self.engine)
        self.check()

    def _in_flight(self) -> int:
        return sum(1 for r in self.requests if r.finish_reason is None)

    def _learn(self, token_ids: list[int]) -> None:
        unit = self.engine.cache_config.match_unit
        for index, key in enumerate(hash_prefix(token_ids, unit)):
            self._keys.setdefault(key, (token_ids, (index + 1) * unit))

    def check(self) -> None:
        """Invariants of every pool and manager, and (ledger) every entry's contents."""
        self.engine.check_invariants()
        if not self.audit_entries or not hasattr(self.engine.runner, "mamba_holds"):
            return
        for request in self.requests:
            self._learn(request.all_token_ids)
        runner = self.engine.runner
        coordinator = self.engine.scheduler.coordinator
        for key, entry in coordinator.attention.pool.entries.items():
            tokens, position = self._keys[key]
            assert position == entry.position, f"attention key {key.hex()} at wrong position"
            start = (
                (position - 1)
                // coordinator.attention.block_size
                * (coordinator.attention.block_size)
            )
            assert runner.attention_holds(entry.block_id, start, tokens[start:position]), (
                f"attention block {entry.block_id} does not hold its entry at {position}"
            )
        for key, entry in coordinator.mamba.pool.entries.items():
            tokens, position = self._keys[key]
            assert position == entry.position, f"mamba key {key.hex()} at wrong position"
            assert runner.mamba_holds(entry.block_id, tokens[:position]), (
                f"mamba block {entry.block_id} does not hold the state at {position}"
            )


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def longest_request(submissions: list[Submission]) -> int:
    """Prompt plus output tokens of the longest request the trace can make."""
    longest = previous = 0
    for sub in submissions:
        if sub.pin or sub.unpin or sub.abort_after is not None:
            continue
        prompt = previous + len(sub.token_ids) if sub.extends_previous else len(sub.token_ids)
        previous = prompt + sub.max_tokens
        longest = max(longest, previous)
    return max(longest, max(len(s.token_ids) for s in submissions))


def sized_pools(config: CacheConfig, submissions: list[Submission], slack: int) -> CacheConfig:
    """The smallest pools that still fit the longest request beside a full pin share, plus
    `slack` blocks: small enough that concurrent requests evict and preempt each other."""
    longest = longest_request(submissions)
    attention = -(-longest // config.attention_block_size) + 1
    mamba = -(-longest // config.mamba_block_size) + 4 + sum(s.pin for s in submissions)
    usable = 1 - config.pin_max_share
    return CacheConfig(
        **{
            **config.__dict__,
            "num_blocks": int(attention / usable) + 1 + slack,
            "num_mamba_blocks": int(mamba / usable) + 1 + slack,
        }
    )
