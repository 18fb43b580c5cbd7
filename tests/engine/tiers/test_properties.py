"""Random traces of put, get, demote, load, remove, lookup, a flipped byte on disk and restart
over tiny tiers, with every invariant checked after every step: each tier within its bytes, the
disk's index equal to its files, no unit held without its parent unless it was put so (its
parent on the device), and every payload read back equal to what was put, or, for a damaged
file, not read back at all."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.tiers import DiskTier, HostTier, TierStack
from engine.tiers.codec import encode
from tests.engine.tiers.conftest import UNIT_BYTES, make_unit

FINGERPRINT = {"model": "tiny", "unit": 4}
BASE = list(range(1000, 1016))
#: Three chains of four units: the second shares the first's first two units, the third
#: shares nothing; the chains' blocks differ in size so that units differ in bytes.
FIRST = [make_unit(BASE, i) for i in range(4)]
CHAINS = [
    FIRST,
    FIRST[:2] + [make_unit(BASE[:8] + list(range(2000, 2008)), i, num_blocks=2) for i in (2, 3)],
    [make_unit(list(range(3000, 3016)), i, num_blocks=3) for i in range(4)],
]
UNITS = {unit.key: unit for chain in CHAINS for unit in chain}
KEYS = sorted(UNITS)
FILE_BYTES = max(len(encode(unit)) for unit in UNITS.values())

keys = st.sampled_from(KEYS)
chains = st.integers(0, len(CHAINS) - 1)
steps = st.one_of(
    st.tuples(st.just("put"), keys),
    st.tuples(st.just("put_chain"), st.tuples(chains, st.integers(1, 4), st.booleans())),
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("demote"), keys),
    st.tuples(st.just("load"), keys),
    st.tuples(st.just("load_chain"), chains),
    st.tuples(st.just("remove"), keys),
    st.tuples(st.just("lookup"), chains),
    st.tuples(st.just("restart"), st.none()),
    st.tuples(st.just("flip"), st.tuples(keys, st.floats(0, 1))),
)


@dataclass
class Trace:
    """What the test knows besides the stack: which units it put while their parent was in no
    tier, and which files it damaged."""

    put_detached: set = field(default_factory=set)
    damaged: set = field(default_factory=set)


def check(stack: TierStack, trace: Trace) -> None:
    stack.check_invariants()
    assert stack.detached <= trace.put_detached, "the stack left a unit without its parent"
    for key, unit in stack.host.units.items():
        assert unit.same_payloads(UNITS[key])


def flip(stack: TierStack, key, where: float, trace: Trace) -> None:
    """Flip one byte of a unit's file behind the tier's back (its length stays)."""
    if stack.disk is None or key not in stack.disk:
        return
    path = stack.disk.path(key)
    data = bytearray(path.read_bytes())
    data[min(int(where * len(data)), len(data) - 1)] ^= 0x10
    path.write_bytes(bytes(data))
    trace.damaged.add(key)


def run(stack: TierStack, step: str, arg, trace: Trace) -> None:
    if step in ("put", "put_chain"):
        units = [UNITS[arg]] if step == "put" else CHAINS[arg[0]][: arg[1]]
        # a device pool frees a table tail first: a chain given up leaf first, or root first
        for unit in reversed(units) if step == "put_chain" and arg[2] else units:
            if unit.parent is not None and not stack.holds(unit.parent):
                trace.put_detached.add(unit.key)  # its parent is on the device, as the caller knows
            stack.put(unit)
    elif step == "load_chain":  # a hit loads its chain root first
        chain = [unit.key for unit in CHAINS[arg]]
        for key in chain[: stack.lookup(chain).num_units]:
            unit = stack.load(key)
            if unit is None:  # damaged, or promoting an earlier unit into tiny tiers gave it up
                assert not stack.holds(key)
                break
            assert unit.same_payloads(UNITS[key])
    elif step in ("get", "load"):
        was_held = stack.holds(arg)
        unit = stack.host.get(arg) if step == "get" else stack.load(arg)
        if arg in trace.damaged and arg not in stack.host and step == "load":
            was_held = was_held and unit is not None  # a damaged file is never read back
        assert (unit is not None) == (was_held if step == "load" else arg in stack.host)
        if unit is not None:
            assert unit.same_payloads(UNITS[arg]) and unit.parent == UNITS[arg].parent
    elif step == "flip":
        flip(stack, *arg, trace)
    elif step == "demote":
        stack.demote(arg)
    elif step == "remove":
        stack.remove(arg)
        assert not stack.holds(arg)
    elif step == "lookup":
        chain = [unit.key for unit in CHAINS[arg]]
        hit = stack.lookup(chain)
        assert all(stack.holds(key) for key in chain[: hit.num_units])
        assert hit.num_units == len(chain) or not stack.holds(chain[hit.num_units])


@pytest.mark.parametrize("has_disk", [True, False], ids=["host-and-disk", "host-only"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    host_units=st.integers(0, 6),
    disk_units=st.integers(0, 8),
    trace=st.lists(steps, min_size=10, max_size=40),
)
def test_random_traces_keep_every_invariant(has_disk, host_units, disk_units, trace) -> None:
    with tempfile.TemporaryDirectory() as directory:

        def open_stack() -> TierStack:
            disk = None
            if has_disk:
                disk = DiskTier(Path(directory), disk_units * FILE_BYTES, FINGERPRINT)
            return TierStack(HostTier(host_units * UNIT_BYTES), disk)

        stack, known = open_stack(), Trace()
        for step, arg in trace:
            if step == "restart":
                on_disk = set() if stack.disk is None else set(stack.disk.keys())
                stack = open_stack()
                lost = {key for key in on_disk if not stack.holds(key)}
                assert lost <= known.damaged, "a restart lost an intact unit"
                known.put_detached = set(stack.detached)  # the last run's host memory is gone
            else:
                run(stack, step, arg, known)
            check(stack, known)
            if stack.disk is not None:  # a damaged file the disk dropped is gone for good
                known.damaged &= set(stack.disk.keys())
        for key in [] if stack.disk is None else stack.disk.keys():
            unit = stack.disk.get(key)
            if key not in known.damaged:  # (one dropped and written again in a step reads back)
                assert unit is not None, f"unit {key.hex()} lost on disk"
            assert unit is None or unit.same_payloads(UNITS[key])
