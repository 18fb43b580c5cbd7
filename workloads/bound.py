"""The bound under memory: the hit an offline policy that knows the future keeps in a budget.

The oracle (`oracle.py`) ignores memory. This reference replays a trace through a model of the
engine's two pools, `num_blocks` attention blocks and `num_mamba_blocks` state slots, with
Belady's rule. It is a reference built as below, not a proven optimum: an online policy may
in rare cases beat it, and then the figure is printed as it is.

Requests are served in trace order (pins are ignored: the bound is the plain oracle's). Per
request `i` of `P` prompt tokens:

- **Lookup.** The attention match `A` walks the prompt's unit hashes while each is held by an
  attention block in memory: a block holds the unit hashes of its sequence that fall inside it
  (a partly filled tail too), so a hit inside a block works as docs/rules.md section 3 says.
  The hit is the largest `p <= capped_hit(A)` with a state `H_p` in memory (states are not
  downward-closed). Blocks of requests still in flight count: the engine shares them too.
- **Admission.** After `i` is served every attention block of its sequence (prompt, and output
  when given) is in memory, pinned while `i` is in flight; a state is written at every position
  of its sequence where a later request's memory-free oracle hit resumes, and nowhere else. A
  state below `i`'s hit is written too, which an engine could only do by recomputing: it keeps
  the bound monotone in the budgets and can only make it higher.
- **In flight.** Concurrency `c` is a sliding window: while `i` is served, `i` and the `c - 1`
  requests before it hold their blocks (the prompt's, and the output's `max_tokens`) and their
  live state slots: `i` one per `Bm` of its sequence past its oracle hit, as its first chunk
  writes them into the engine's aligned Mamba table (`mamba_block_size`; one slot when it is
  not given), the others one each, their live state, since the engine hands back a passed slot
  that holds no state or only tail states (`live_slots`). The window holds fewer when their
  live states would not fit the state budget, as an engine admits only what its pool holds
  (the oldest leave first; `i` always runs). The rest of each budget holds cached blocks and
  states. When pinned blocks alone exceed the budget, everything unpinned is evicted and the
  pool runs over.
- **Eviction** is Belady's, in each pool apart: when a pool is over its budget, the unpinned
  item whose next use is farthest (or never) goes, a new item included (bypass). A block's next
  use is the next request whose oracle hit needs one of the unit hashes it holds (with EAGLE,
  one unit past the hit); a state's is the next request whose oracle hit covers its position
  (a shorter state is where a request falls back when its own resume state is gone, so a
  family's shared system prompt state stays while every request reads it). Each pool is
  Belady's apart: the two together, and the value of a state (its position), are not weighed,
  so the bound is a strong reference, not the optimum.

**Order-blind** (`order_blind=True`): the same model with one piece of the future taken away,
the order. Each pool gives up the unpinned item fewer later requests will read (counted as
above; one never read first), the least recently read or written first among equals. It knows
how often each item will be read again and where states will be resumed, which no online
policy knows, but not when: in a shuffled trace it tells how much of the bound comes from
knowing which family comes next. It is a reference too, not the best order-blind policy.

`working_set` is the budget at which nothing is ever evicted: every distinct attention block
of the trace plus the in-flight outputs' blocks, every distinct resume state plus the most
slots the requests in flight would hold at once if each held its first chunk's slots all the
while (`most_live_states`: more than the window holds). There the bound equals the oracle.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from engine.hashing import BlockHash
from engine.traces.trace import TraceItem
from workloads.belady import NEVER, BeladyPool
from workloads.bound_plan import Plan, plan_requests
from workloads.oracle import capped_hit


class Budget(NamedTuple):
    num_blocks: int  # attention blocks
    num_mamba_blocks: int  # Mamba state slots


class BoundHit(NamedTuple):
    request_id: str
    num_prompt_tokens: int
    num_oracle_tokens: int  # the memory-free oracle's hit
    num_bound_tokens: int  # the hit the offline policy keeps in the budget


class BoundResult(NamedTuple):
    hits: list[BoundHit]
    budget: Budget
    concurrency: int

    @property
    def num_prompt_tokens(self) -> int:
        return sum(h.num_prompt_tokens for h in self.hits)

    @property
    def num_bound_tokens(self) -> int:
        return sum(h.num_bound_tokens for h in self.hits)

    @property
    def num_oracle_tokens(self) -> int:
        return sum(h.num_oracle_tokens for h in self.hits)

    @property
    def hit_rate(self) -> float:
        total = self.num_prompt_tokens
        return self.num_bound_tokens / total if total else 0.0

    def as_dict(self) -> dict:
        return {
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_bound_tokens": self.num_bound_tokens,
            "hit_rate": self.hit_rate,
            "num_blocks": self.budget.num_blocks,
            "num_mamba_blocks": self.budget.num_mamba_blocks,
            "concurrency": self.concurrency,
        }


STAMP = 1 << 32  # the order-blind priority's room for the recency stamp


class Uses:
    """When each key is read next: request indices, ascending, per unit hash a block holds
    (the blocks' needs) and per resume state. A request reads every resume state inside its
    oracle hit, not only the one it resumes at: under memory it may fall back to one.

    `block` and `state` give the priority a pool evicts the largest of first: the next use
    (`NEVER` for none); `order_blind`, below `NEVER` by the number of later reads (times
    `STAMP`) and by how recently it was asked (each ask is a read or a write)."""

    def __init__(self, plans: Sequence[Plan], order_blind: bool = False) -> None:
        self.order_blind = order_blind
        self._stamp = 0
        self.by_need: dict[BlockHash, list[int]] = {}
        self.by_resume: dict[BlockHash, list[int]] = {}
        resumes = {plan.resume for plan in plans if plan.resume is not None}
        for index, plan in enumerate(plans):
            for need in plan.needs:
                self.by_need.setdefault(need, []).append(index)
            for key in plan.prompt_hashes[: plan.num_oracle_units]:
                if key in resumes:
                    self.by_resume.setdefault(key, []).append(index)

    @staticmethod
    def after(indices: list[int] | None, now: int) -> int:
        if not indices:
            return NEVER
        at = bisect_right(indices, now)
        return indices[at] if at < len(indices) else NEVER

    def block(self, unit_hashes: Iterable[BlockHash], now: int) -> int:
        if self.order_blind:
            reads = max(
                (self.reads_after(self.by_need.get(h), now) for h in unit_hashes), default=0
            )
            return self._blind(reads)
        return min((self.after(self.by_need.get(h), now) for h in unit_hashes), default=NEVER)

    def state(self, key: BlockHash, now: int) -> int:
        if self.order_blind:
            return self._blind(self.reads_after(self.by_resume.get(key), now))
        return self.after(self.by_resume.get(key), now)

    @staticmethod
    def reads_after(indices: list[int] | None, now: int) -> int:
        return len(indices) - bisect_right(indices, now) if indices else 0

    def _blind(self, reads: int) -> int:
        """The order-blind priority of an item `reads` later requests read, asked now."""
        if not reads:
            return NEVER
        self._stamp += 1
        return NEVER - 1 - reads * STAMP - self._stamp


class Memory:
    """The two pools of the bound and the unit hashes the held attention blocks hold."""

    def __init__(self, plans: Sequence[Plan], order_blind: bool = False) -> None:
        self.uses = Uses(plans, order_blind)
        self.blocks = BeladyPool()
        self.states = BeladyPool()
        self.unit_hashes: dict[BlockHash, tuple[BlockHash, ...]] = {}  # held block -> units
        self.holders: dict[BlockHash, set[BlockHash]] = {}  # unit hash -> held blocks

    def hit(self, plan: Plan, unit: int, eagle: bool) -> int:
        """The request's hit: the attention match walked over held units, capped, then the
        largest state at or below it. Changes nothing."""
        num_matched = 0
        for unit_hash in plan.prompt_hashes:
            if unit_hash not in self.holders:
                break
            num_matched += 1
        capped = capped_hit(num_matched * unit, len(plan.request.token_ids), unit, eagle)
        for num_units in range(capped // unit, 0, -1):
            if plan.prompt_hashes[num_units - 1] in self.states:
                return num_units * unit
        return 0

    def admit(self, plan: Plan, now: int) -> None:
        """Request `now` ran: its blocks are held and pinned, the states later requests resume
        at are written, and every item it read gets its next use after it."""
        for block in plan.blocks:
            if block.key not in self.blocks:
                self.unit_hashes[block.key] = block.unit_hashes
                for unit_hash in block.unit_hashes:
                    self.holders.setdefault(unit_hash, set()).add(block.key)
            self.blocks.put(block.key, self.uses.block(block.unit_hashes, now))
            self.blocks.pin(block.key)
        for need in plan.needs:
            for key in self.holders.get(need, ()):
                self.blocks.put(key, self.uses.block(self.unit_hashes[key], now))
        for key in plan.sequence_hashes:
            if key in self.uses.by_resume:
                next_use = self.uses.state(key, now)
                if next_use != NEVER or key in self.states:
                    self.states.put(key, next_use)

    def release(self, plan: Plan) -> None:
        for block in plan.blocks:
            self.blocks.unpin(block.key)

    def evict_to(self, budget: Budget) -> None:
        for key in self.blocks.evict_to(budget.num_blocks):
            for unit_hash in self.unit_hashes.pop(key):
                holders = self.holders[unit_hash]
                holders.discard(key)
                if not holders:
                    del self.holders[unit_hash]
        self.states.evict_to(budget.num_mamba_blocks)


def bound(
    items: Iterable[TraceItem],
    unit: int,
    block_size: int,
    budget: Budget,
    concurrency: int = 1,
    eagle: bool = False,
    outputs: Mapping[str, Sequence[int]] | None = None,
    mamba_block_size: int | None = None,
    order_blind: bool = False,
) -> BoundResult:
    """The hit of every request of `items` (pins dropped) under `budget`, `concurrency` in
    flight; `block_size` is the attention block `Ba` (times `dcp_size`); with `order_blind`,
    the reference that knows how often each item is read again but not when."""
    if concurrency < 1:
        raise ValueError(f"the concurrency must be at least 1, got {concurrency}")
    plans = plan_requests(items, unit, block_size, eagle, outputs)
    memory = Memory(plans, order_blind)
    peak = [plan.num_live_states(mamba_block_size) for plan in plans]
    hits = []
    first = 0  # the oldest request in flight
    for now, plan in enumerate(plans):
        start = window_start(peak[now], now, concurrency, budget.num_mamba_blocks)
        for done in plans[first:start]:
            memory.release(done)
        first = start
        window = plans[start : now + 1]
        room = Budget(
            budget.num_blocks - sum(p.num_transient for p in window),
            budget.num_mamba_blocks - live_slots(peak[now], now - start),
        )
        memory.evict_to(room)  # before the lookup: what left the window may be gone
        hit = memory.hit(plan, unit, eagle)
        request = plan.request
        hits.append(
            BoundHit(request.request_id, len(request.token_ids), plan.num_oracle_tokens, hit)
        )
        memory.admit(plan, now)
        memory.evict_to(room)
    return BoundResult(hits, budget, concurrency)


def live_slots(peak: int, num_before: int) -> int:
    """The state slots a window holds while a request is admitted: its `peak` (its first
    chunk writes a slot per `Bm`), and one live state for each of the `num_before` requests
    still in flight (the engine hands back a passed slot that holds no state or only tail
    states)."""
    return peak + num_before


def window_start(peak: int, now: int, concurrency: int, num_mamba_blocks: int) -> int:
    """The oldest request still in flight when `now` starts, its first chunk holding `peak`
    slots: at most `concurrency` of them, and no more than their live slots fit in
    `num_mamba_blocks` (an engine admits no request its pool cannot hold), though `now`
    itself always runs."""
    start = max(now - concurrency + 1, 0)
    while start < now and live_slots(peak, now - start) > num_mamba_blocks:
        start += 1
    return start


def working_set(
    items: Iterable[TraceItem],
    unit: int,
    block_size: int,
    concurrency: int = 1,
    eagle: bool = False,
    outputs: Mapping[str, Sequence[int]] | None = None,
    mamba_block_size: int | None = None,
) -> Budget:
    """The budget at which the bound never evicts: every distinct attention block of the trace
    and the most in-flight blocks that hold no unit, every distinct resume state and the most
    slots the requests in flight would hold at once (`most_live_states`). There the bound
    equals the oracle."""
    plans = plan_requests(items, unit, block_size, eagle, outputs)
    keys = {block.key for plan in plans for block in plan.blocks}
    resumes = {plan.resume for plan in plans if plan.resume is not None}
    transient = [plan.num_transient for plan in plans]
    return Budget(
        len(keys) + most_in_window(transient, concurrency),
        len(resumes) + most_live_states(plans, concurrency, mamba_block_size),
    )


def most_in_window(values: list[int], concurrency: int) -> int:
    """The largest sum of `concurrency` consecutive values (fewer at the start)."""
    return max(
        (sum(values[max(i - concurrency + 1, 0) : i + 1]) for i in range(len(values))), default=0
    )


def most_live_states(plans: list[Plan], concurrency: int, mamba_block_size: int | None) -> int:
    """The most state slots a window of `concurrency` requests in flight would hold at once if
    each held its first chunk's slots (`Plan.num_live_states`) all the while: more than the
    bound's window holds (`live_slots`), so the working set and the floors it sets stay
    generous."""
    return most_in_window([plan.num_live_states(mamba_block_size) for plan in plans], concurrency)


def in_flight_need(
    items: Iterable[TraceItem],
    unit: int,
    block_size: int,
    concurrency: int = 1,
    eagle: bool = False,
    outputs: Mapping[str, Sequence[int]] | None = None,
    mamba_block_size: int | None = None,
) -> Budget:
    """What the bound's requests in flight hold at most at once: the distinct blocks of a
    window of `concurrency` requests and their blocks that hold no unit, and the slots they
    would hold if each held its first chunk's slots all the while (`most_live_states`, more
    than the window holds). Below it the bound's pools run over (everything unpinned is
    evicted)."""
    plans = plan_requests(items, unit, block_size, eagle, outputs)
    most = 0
    for end in range(1, len(plans) + 1):
        window = plans[max(end - concurrency, 0) : end]
        keys = {block.key for plan in window for block in plan.blocks}
        most = max(most, len(keys) + sum(plan.num_transient for plan in window))
    return Budget(most, most_live_states(plans, concurrency, mamba_block_size))
