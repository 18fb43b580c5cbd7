"""The unit a tier keeps: one usable hit's worth of cache, moved as a whole.

A run of attention blocks is worth something only up to the deepest state that backs it, and a
state only while its attention prefix is held somewhere. So a unit is the attention blocks of
`[start, end)` (the run since its parent unit) plus the recurrent state at `end`; its key is
the chain hash `H_end` (`engine.hashing`, salts already mixed in) and its parent's key is
`H_start`. A chain of units root to leaf rebuilds a hit at the leaf's `end`.

Payloads are mappings of names to CPU tensors: on the torch runner a block's per-layer K/V
(`"k.3"`, `"v.3"`) and a state slot's per-layer conv and SSM tensors (`"conv.0"`, `"ssm.0"`);
the ledger runner writes its records (token ids, `(length, digest)`) as int64 tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.hashing import BlockHash

if TYPE_CHECKING:  # torch loads on first use, so a router importing the tiers never loads it
    import torch

Payload = Mapping[str, "torch.Tensor"]


def payload_bytes(payload: Payload) -> int:
    """The bytes the tensors of `payload` hold."""
    return sum(tensor.numel() * tensor.element_size() for tensor in payload.values())


@dataclass(frozen=True)
class TierUnit:
    """A usable-hit unit. After a tier takes it, the tier owns its tensors: the caller must
    not write to them (the host tier keeps them, or pinned copies of them, as they are)."""

    key: BlockHash  # `H_end`: the chain hash of the unit's last match unit
    parent: BlockHash | None  # `H_start`, the unit before it; None when `start` is 0
    start: int  # [start, end): the tokens whose attention this unit carries
    end: int
    blocks: tuple[Payload, ...]  # the attention blocks of [start, end), in table order
    state: Payload  # the recurrent state after `end` tokens
    size_bytes: int = field(init=False)  # computed from the tensors, never given

    def __post_init__(self) -> None:
        import torch

        if not 0 <= self.start < self.end:
            raise ValueError(f"unit {self.key.hex()}: token range [{self.start}, {self.end})")
        if (self.parent is None) != (self.start == 0):
            raise ValueError(
                f"unit {self.key.hex()}: starts at {self.start} but its parent is "
                f"{'absent' if self.parent is None else self.parent.hex()}"
            )
        for where, payload in self.payloads():
            for name, tensor in payload.items():
                if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
                    raise ValueError(
                        f"unit {self.key.hex()}: {where} tensor {name!r} is not a CPU tensor"
                    )
        size = sum(payload_bytes(payload) for _, payload in self.payloads())
        object.__setattr__(self, "size_bytes", size)

    def payloads(self) -> list[tuple[str, Payload]]:
        """Every payload with where it sits: `("block 0", ...)`, ..., `("state", ...)`."""
        return [(f"block {i}", block) for i, block in enumerate(self.blocks)] + [
            ("state", self.state)
        ]

    def pinned(self) -> TierUnit:
        """The same unit with its tensors in page-locked memory (for fast copies to a GPU);
        itself where there is no CUDA to copy to."""
        import torch

        if not torch.cuda.is_available():
            return self

        def pin(payload: Payload) -> dict[str, torch.Tensor]:
            return {name: t if t.is_pinned() else t.pin_memory() for name, t in payload.items()}

        return TierUnit(
            self.key,
            self.parent,
            self.start,
            self.end,
            tuple(pin(block) for block in self.blocks),
            pin(self.state),
        )

    def same_payloads(self, other: TierUnit) -> bool:
        """Both units carry the same names, dtypes, shapes and values (`torch.equal`)."""
        import torch

        mine, theirs = self.payloads(), other.payloads()
        if len(mine) != len(theirs):
            return False
        for (_, a), (_, b) in zip(mine, theirs, strict=True):
            if a.keys() != b.keys():
                return False
            for name, tensor in a.items():
                if tensor.dtype != b[name].dtype or not torch.equal(tensor, b[name]):
                    return False
        return True
