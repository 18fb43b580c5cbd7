"""An executable spec of docs/rules.md: what each request hits and what it leaves behind.

At concurrency 1 with pools large enough that nothing is evicted, a request's hit depends only on
what the requests before it computed. This model keeps, per group, the set of cached prefixes
(token tuples) and derives everything from the rules as docs/rules.md states them, without reading
the engine's code:

- attention: every prefix on the attention grid (`U` when hits are fine-grained, else one block)
  of every computed sequence (prompt plus the outputs fed back in decode) is matchable, so the
  match is downward-closed;
- Mamba: a checkpoint is the state at exactly one prefix, kept only where the rules say.

Symbols: `P` prompt length, `U` match unit, `Ba` attention block (times DCP), `Bm` Mamba block,
`S` scheduler block, `A` attention match after the EAGLE drop, `M` the hit, `j` the junction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class Rules:
    """The geometry and policy the rules depend on (the fields of `CacheConfig`, derived here
    again from docs/rules.md rather than from the engine's properties)."""

    attention_block: int  # Ba (times D)
    mamba_block: int  # Bm
    unit: int  # U
    eagle: bool = False
    partial_hits: bool = True
    junction_checkpoints: bool = True
    inline: bool = True  # checkpoint_mode "inline"; False: "stops"
    chunk_limit: int = 8192  # min(token budget, long_prefill_threshold)
    checkpoint_interval: int | None = 0  # None: 64 rounded up to U
    learns_branches: bool = False  # the eviction policy learns where prompts part (`reuse`)

    @classmethod
    def of(cls, config, chunk_limit: int) -> Rules:
        """From an engine `CacheConfig` (read by field name only) and the chunk limit."""
        unit = config.prefix_match_unit
        block = config.block_size * config.dcp_size
        if unit is None:
            unit = math.gcd(block, config.mamba_block_size)
        return cls(
            block,
            config.mamba_block_size,
            unit,
            config.eagle,
            config.partial_hits,
            config.junction_checkpoints,
            config.checkpoint_mode == "inline",
            chunk_limit,
            config.checkpoint_interval,
            config.eviction == "reuse",
        )

    @property
    def interval(self) -> int:
        """Where interval states are written: inline with fine-grained hits only; 0: none."""
        if not (self.inline and self.fine):
            return 0
        if self.checkpoint_interval is None:
            return -(-64 // self.unit) * self.unit
        return self.checkpoint_interval

    @property
    def fine(self) -> bool:
        """Partial hits are on and some block is larger than `U`."""
        return self.partial_hits and self.unit < max(self.attention_block, self.mamba_block)

    @property
    def scheduler_block(self) -> int:
        """`S`: `Bm` with partial hits on, `lcm(Ba, Bm)` with them off."""
        if self.partial_hits:
            return self.mamba_block
        return math.lcm(self.attention_block, self.mamba_block)

    @property
    def attention_grid(self) -> int:
        return self.unit if self.fine else self.attention_block

    @property
    def hit_grid(self) -> int:
        return self.unit if self.fine else self.scheduler_block

    @property
    def eagle_drop(self) -> int:
        return 0 if not self.eagle else self.attention_grid


class Outcome(NamedTuple):
    """What the rules say one request does."""

    hit: int  # M: prompt tokens not computed (num_cached_tokens)
    attention: int  # A: the attention match after the EAGLE drop
    chunks: list[tuple[int, int]]  # prefill chunks [start, end)
    checkpoints: list[int]  # positions whose Mamba state it registers, ascending


def floor_to(position: int, grid: int) -> int:
    return position // grid * grid


@dataclass
class RulesModel:
    rules: Rules
    attention: set[tuple[int, ...]] = field(default_factory=set)  # matchable prefixes
    mamba: set[tuple[int, ...]] = field(default_factory=set)  # checkpointed prefixes
    pins: list[tuple[int, ...]] = field(default_factory=list)  # pinned prefixes (boundaries)
    # every admitted prompt's whole units, in order: where later ones branch (section 5)
    chains: list[tuple[int, ...]] = field(default_factory=list)

    # ------------------------------------------------------------------ lookup
    def lookup(self, prompt: Sequence[int], needs_logits: bool = True) -> tuple[int, int]:
        """`(A, M)` for a prompt: the attention match after the EAGLE drop, and the hit."""
        r, num = self.rules, len(prompt)
        limit = num - 1 if needs_logits else num  # one token must produce logits
        drop = r.eagle_drop if needs_logits else 0
        # EAGLE reads the proof one unit (block) past the limit, within the prompt's hashes
        proof = min(limit + drop, floor_to(num, r.unit))
        grid = r.attention_grid
        match = next(
            (
                p
                for p in range(floor_to(proof, grid), 0, -grid)
                if tuple(prompt[:p]) in self.attention
            ),
            0,
        )
        match = floor_to(max(match - drop, 0), grid)
        # Mamba, right to left: not downward-closed, so every grid point is probed
        hit = next(
            (
                p
                for p in range(floor_to(match, r.hit_grid), 0, -r.hit_grid)
                if tuple(prompt[:p]) in self.mamba
            ),
            0,
        )
        return match, hit

    # ------------------------------------------------------------------ checkpoints
    def branch(self, prompt: Sequence[int]) -> int | None:
        """Where the prompt parts from every earlier one (section 5's branch point): the
        longest whole-unit prefix an earlier prompt shares, when some earlier prompt sharing
        it goes on past it; records the prompt."""
        unit = self.rules.unit
        chain = tuple(prompt[: floor_to(len(prompt), unit)])
        run = max(
            (p for q in self.chains for p in range(unit, min(len(q), len(chain)) + 1, unit)
             if q[:p] == chain[:p]),
            default=0,
        )  # fmt: skip
        passed = [q for q in self.chains if len(q) >= run and q[:run] == chain[:run]]
        self.chains.append(chain)
        if not run or all(len(q) == run for q in passed):
            return None
        return run

    def targets(
        self, prompt: Sequence[int], match: int, hit: int, is_pin: bool, branch: int | None
    ) -> set[int]:
        """Checkpoint positions beyond block boundaries: `c`, `e`, `j`, `floor(j/S)*S`, the
        branch point, pins."""
        r, num = self.rules, len(prompt)
        floor = r.unit if r.partial_hits else r.scheduler_block
        out: set[int] = set()
        if r.junction_checkpoints and match <= hit and branch is not None:
            out.add(floor_to(branch - r.eagle_drop, floor))  # kept only above the hit (below)
        if r.partial_hits:
            resend = (
                max(floor_to(num, r.unit) - r.unit, 0) if r.eagle else floor_to(num - 1, r.unit)
            )
            out |= {resend, floor_to(num, r.unit)}
        if r.junction_checkpoints and match > hit:
            out |= {floor_to(match, floor), floor_to(match, r.scheduler_block)}
        if is_pin:
            out.add(num)
        else:
            prefix = tuple(prompt)
            out |= {floor_to(len(p), floor) for p in self.pins if prefix[: len(p)] == p}
        return {p for p in out if 0 < p <= num}

    def chunk_ends(self, start: int, num: int, stops: set[int], eagle: bool) -> list[int]:
        """The prefill split from `start` (the scheduler split rule, one request per step)."""
        r, size = self.rules, self.rules.scheduler_block
        ends = []
        while start < num:
            end = start + r.chunk_limit
            if end >= num:
                end = num
            elif floor_to(end, size) > start:
                end = floor_to(end, size)
            elif size <= r.chunk_limit:
                raise AssertionError("no progress with a whole step's budget")
            if not r.inline:
                inside = set(stops)
                if start % size:
                    inside.add(floor_to(start, size) + size)
                inside.add(num - num % size - (size if eagle else 0))
                end = min((p for p in inside if start < p < end), default=end)
            ends.append(end)
            start = end
        return ends

    # ------------------------------------------------------------------ requests
    def request(self, prompt: Sequence[int], output_ids: Sequence[int]) -> Outcome:
        """Run one request (its outputs as sampled) and record what it caches."""
        return self._run(list(prompt), list(output_ids), is_pin=False)

    def pin(self, token_ids: Sequence[int]) -> Outcome | None:
        """Materialize a pin: a prefill of the prefix floored to the hit grid, no logits.
        `None` when that floors to 0 (the engine refuses the pin)."""
        boundary = floor_to(len(token_ids), self.rules.hit_grid)
        if boundary == 0:
            return None
        prefix = list(token_ids[:boundary])
        outcome = self._run(prefix, [], is_pin=True)
        self.pins.append(tuple(prefix))
        return outcome

    def _run(self, prompt: list[int], output_ids: list[int], is_pin: bool) -> Outcome:
        r, num = self.rules, len(prompt)
        match, hit = self.lookup(prompt, needs_logits=not is_pin)
        if is_pin and hit >= num:
            return Outcome(hit, match, [], [])
        branch = self.branch(prompt) if r.learns_branches else None
        targets = self.targets(prompt, match, hit, is_pin, branch)
        ends = self.chunk_ends(hit, num, targets, eagle=r.eagle and not is_pin)
        chunks = list(zip([hit, *ends], ends, strict=False))
        # decode feeds every output but the last back in: one position per step
        computed = num + max(len(output_ids) - 1, 0)
        tokens = prompt + output_ids
        spare: set[int] = set()
        if r.inline:
            written = {p for p in targets if p > hit} | set(
                range(floor_to(hit, r.mamba_block) + r.mamba_block, num + 1, r.mamba_block)
            )
            if r.interval:  # strictly inside each chunk, with room to spare (roomy pools)
                spare = set(range(floor_to(hit, r.interval) + r.interval, num, r.interval))
                spare -= set(ends)
        else:
            written = set(ends)
        written |= set(range(num + 1, computed + 1)) | spare
        checkpoints = sorted(
            p for p in written if p > hit and (p in targets or p % r.mamba_block == 0 or p in spare)
        )
        self.mamba.update(tuple(tokens[:p]) for p in checkpoints)
        grid = r.attention_grid
        self.attention.update(tuple(tokens[:p]) for p in range(grid, computed + 1, grid))
        return Outcome(hit, match, chunks, checkpoints)
