"""`junction attach vllm --feed-port` over vLLM 0.33's own scheduler and `ZmqEventPublisher`
(benchmarks/peer/vllm_kv_events.py): the feed a router reads holds one key for each block
vLLM's pool holds, group by group, and every key is Junction's chained hash of a prefix of a
prompt vLLM was given, ending on the attention grid. A router's index fed from it
predicts, for a prompt vLLM has seen, a hit on the Mamba grid."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.bridge import KvEventsPeer
from engine.feed import FeedSnapshot
from engine.hashing import hash_prefix
from router.engines import FleetEngine
from tests.attach.test_attach_feed import AttachProcess
from tests.peer.conftest import family_trace
from tests.peer.test_kv_events_bridge import pool_table
from tests.polling import wait_until

# a pool that holds the whole trace: every block vLLM stored is still there to compare
POOL = ("--num-blocks", "4000", "--num-mamba-blocks", "400")


@pytest.fixture(scope="module")
def vllm() -> Iterator[KvEventsPeer]:
    with KvEventsPeer(True, *POOL) as peer:
        yield peer


def snapshot(attach: AttachProcess, engine: FleetEngine) -> FeedSnapshot | None:
    """A new connection's hello and snapshot, applied to `engine`."""
    try:
        with attach.follow() as socket:
            frames = [socket.recv(10), socket.recv(10)]
    except Exception:  # noqa: BLE001 - not serving yet, or a new epoch closed it: try again
        return None
    for frame in frames:
        engine.apply(frame)
    return engine.index is not None and engine.index.is_ready and frames


def test_the_feed_holds_junctions_keys_of_the_blocks_vllm_holds(vllm: KvEventsPeer) -> None:
    requests = family_trace(11, num_requests=12, max_prompt=1500)
    vllm.replay(requests)
    groups = pool_table(vllm.pool())
    attach = AttachProcess(vllm, model="vllm-hybrid")
    engine = FleetEngine(attach.http_url)
    try:

        def caught_up() -> bool:
            if not snapshot(attach, engine):
                return False
            attention, mamba = engine.index.num_keys
            return attention == len(groups["attention"]) and mamba == len(groups["mamba"])

        assert wait_until(caught_up, 120, 0.5), engine.index and engine.index.num_keys
        geometry = engine.hello.geometry
        assert engine.hello.serve_url and not engine.hello.reports_finished
        assert geometry.attention_block_size == 16 and geometry.hit_alignment == 256
        unit = geometry.match_unit
        prefixes: dict[int, set[bytes]] = {16: set(), 256: set()}
        for request in requests:
            hashes = hash_prefix(request["prompt_token_ids"], unit)
            for grid, keys in prefixes.items():
                keys.update(
                    hashes[p // unit - 1] for p in range(grid, len(hashes) * unit + 1, grid)
                )
        attention, mamba = engine.index.groups
        assert set(attention) <= prefixes[16], "an attention key no prompt prefix explains"
        # vLLM 0.33 keeps a prompt's last state at its last full 16-token block, not on the
        # 256-token Mamba grid: the states lie on the attention grid
        assert set(mamba) <= prefixes[16], "a state key no prompt prefix explains"
        assert set(mamba) & prefixes[256], "no state on the Mamba grid"

        seen = requests[-1]["prompt_token_ids"]
        found = engine.index.hit(hash_prefix(seen, unit), len(seen))
        assert found is not None and found.length > 0 and found.length % 256 == 0
    finally:
        print(attach.log())
