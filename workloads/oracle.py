"""The oracle: the most prompt tokens any cache of unlimited size could serve.

For each request, in trace order: the longest prefix it truly shares with an earlier prompt
(and, when given, that prompt's output), or with a prefix pinned before it; floored to the
match unit `U` and capped as a hit is capped (docs/rules.md section 3):

- without EAGLE, at most `P - 1` tokens: `min(shared, floor((P - 1) / U) * U)`;
- with EAGLE, the attention proof may reach `floor(P / U) * U` and one unit is dropped:
  `max(min(shared, floor(P / U) * U) - U, 0)`.

Sharing is found by the chained unit hashes (`H_p` names the whole prefix `[0, p)`), so a
prefix counts only if every token of it is equal, and a different `cache_salt` never shares.
It ignores timing: a request shares with every earlier one even if that one is still running.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from engine.hashing import BlockHash, hash_prefix, num_known_units
from engine.traces.trace import TraceItem, TracePin, TraceRequest


class OracleHit(NamedTuple):
    request_id: str
    num_prompt_tokens: int
    num_shared_tokens: int  # floored to U, before the cap
    num_oracle_tokens: int  # the hit an unlimited cache could give


class OracleResult(NamedTuple):
    hits: list[OracleHit]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(h.num_prompt_tokens for h in self.hits)

    @property
    def num_oracle_tokens(self) -> int:
        return sum(h.num_oracle_tokens for h in self.hits)

    @property
    def hit_rate(self) -> float:
        total = self.num_prompt_tokens
        return self.num_oracle_tokens / total if total else 0.0

    def as_dict(self) -> dict:
        return {
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_oracle_tokens": self.num_oracle_tokens,
            "hit_rate": self.hit_rate,
        }


def capped_hit(num_shared: int, num_prompt_tokens: int, unit: int, eagle: bool) -> int:
    """The hit a request of `num_prompt_tokens` may take of `num_shared` shared tokens."""
    shared = num_shared // unit * unit
    if eagle:
        return max(min(shared, num_prompt_tokens // unit * unit) - unit, 0)
    return min(shared, (num_prompt_tokens - 1) // unit * unit)


def oracle(
    items: Iterable[TraceItem],
    unit: int,
    eagle: bool = False,
    outputs: Mapping[str, Sequence[int]] | None = None,
) -> OracleResult:
    """The oracle hit of every request of `items`, in order. `outputs` (request id -> output
    token ids) lets later requests share earlier outputs too."""
    if unit <= 0:
        raise ValueError(f"the match unit must be positive, got {unit}")
    known: set[BlockHash] = set()
    hits: list[OracleHit] = []
    for item in items:
        if isinstance(item, TracePin):
            known.update(hash_prefix(item.token_ids, unit, item.cache_salt))
            continue
        assert isinstance(item, TraceRequest)
        hashes = hash_prefix(item.token_ids, unit, item.cache_salt)
        shared = num_known_units(hashes, known) * unit
        hits.append(
            OracleHit(
                item.request_id,
                len(item.token_ids),
                shared,
                capped_hit(shared, len(item.token_ids), unit, eagle),
            )
        )
        sequence = item.token_ids
        if outputs is not None and outputs.get(item.request_id):
            sequence = [*sequence, *outputs[item.request_id]]
            hashes = hash_prefix(sequence, unit, item.cache_salt)
        known.update(hashes)
    return OracleResult(hits)
