"""A usable-hit unit: its bytes come from its tensors, its range agrees with its parent, and its
payloads are CPU tensors (what the torch runner and the ledger runner would both hand over)."""

from __future__ import annotations

import pytest
import torch

from engine.hashing import hash_prefix
from engine.tiers import TierUnit
from tests.engine.tiers.conftest import make_chain


def test_the_size_is_counted_from_the_tensors() -> None:
    keys = hash_prefix(list(range(8)), 4)
    blocks = ({"k.0": torch.zeros(2, 3, dtype=torch.bfloat16), "v.0": torch.zeros(6)},)
    state = {"conv.0": torch.zeros(5, dtype=torch.int64)}
    unit = TierUnit(keys[1], keys[0], 4, 8, blocks, state)
    assert unit.size_bytes == 2 * 3 * 2 + 6 * 4 + 5 * 8


def test_a_size_cannot_be_given() -> None:
    keys = hash_prefix(list(range(4)), 4)
    with pytest.raises(TypeError):
        TierUnit(keys[0], None, 0, 4, (), {}, size_bytes=1)  # type: ignore[call-arg]


def test_a_ledger_record_is_a_payload_too() -> None:
    """The ledger runner's records: a block's token ids and a state's (length, digest)."""
    keys = hash_prefix(list(range(4)), 4)
    tokens = {"token_ids": torch.tensor([0, 1, 2, 3])}
    state = {"length": torch.tensor([4]), "digest": torch.tensor([123456789])}
    assert TierUnit(keys[0], None, 0, 4, (tokens,), state).size_bytes == 6 * 8


@pytest.mark.parametrize(
    ("parent", "start", "end", "message"),
    [
        (None, 4, 8, "starts at 4 but its parent is absent"),
        (b"p" * 16, 0, 4, "starts at 0 but its parent is 70"),
        (None, 0, 0, "token range [0, 0)"),
    ],
)
def test_a_range_that_disagrees_with_the_parent_is_refused(parent, start, end, message) -> None:
    key = hash_prefix(list(range(4)), 4)[0]
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        TierUnit(key, parent, start, end, (), {})


def test_payloads_must_be_cpu_tensors() -> None:
    key = hash_prefix(list(range(4)), 4)[0]
    with pytest.raises(ValueError, match="block 0 tensor 'k.0' is not a CPU tensor"):
        TierUnit(key, None, 0, 4, ({"k.0": [1.0]},), {})  # type: ignore[dict-item]


def test_without_cuda_pinning_is_the_unit_itself() -> None:
    unit = make_chain(1, 1)[0]
    if torch.cuda.is_available():
        pytest.skip("CUDA present: pinned copies are made")
    assert unit.pinned() is unit


def test_same_payloads_compares_values_and_dtypes() -> None:
    a, b = make_chain(1, 1)[0], make_chain(1, 1)[0]
    assert a.same_payloads(b)
    assert not a.same_payloads(make_chain(2, 1)[0])
    halved = TierUnit(
        a.key, a.parent, a.start, a.end, a.blocks, {name: t.half() for name, t in a.state.items()}
    )
    assert not a.same_payloads(halved)
