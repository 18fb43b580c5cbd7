"""`junction attach` with a small outbox against the real API on PostgreSQL: a batch whose
stored events are each larger than the outbox (2^20 token ids a block) is forwarded without
its token ids, on its own, and the valid batches after it reach the store, with no loop of
table resends (issue 47, item 2: 145 resends in 14 s, the 3 valid batches never stored)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from attach.bridge.peer_wire import hash_hex
from tests.api.conftest import POSTGRES_ADMIN_URL, Postgres, api_on_postgres
from tests.api.processes import ApiProcess
from tests.attach.conftest import FakePeer, stored
from tests.peer.test_kv_events_bridge import Attach
from tests.polling import wait_until

OUTBOX_BYTES = 4 * 1024 * 1024
BLOCK_TOKENS = 1 << 20


@pytest.fixture(scope="module")
def api() -> Iterator[ApiProcess]:
    server = Postgres(POSTGRES_ADMIN_URL)
    if not server.is_reachable():
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}")
    with api_on_postgres(server, "junction_attach_bound") as process:
        yield process


def test_a_block_larger_than_the_outbox_does_not_stop_the_batches_after_it(api) -> None:
    peer = FakePeer()
    attach = Attach(api, peer, "peer-huge", "--outbox-bytes", str(OUTBOX_BYTES))
    try:
        tokens = [100_000 + i % 1000 for i in range(BLOCK_TOKENS)]
        huge = [
            stored(
                [1000 + i], parent=999 + i if i else None, tokens=tokens, block_size=BLOCK_TOKENS
            )
            for i in range(3)
        ]
        peer.publish(huge)
        valid = [[5000 + 100 * k + j for j in range(21)] for k in range(3)]
        for hashes in valid:
            peer.publish([stored(hashes)])
        wanted = {hash_hex(h) for hashes in valid for h in hashes}

        def stored_hashes() -> set[str]:
            return {b["hash"] for b in api.all_blocks("peer-huge", "peer-blocks")}

        assert wait_until(lambda: wanted <= stored_hashes(), 20, 0.3), (
            f"{len(wanted - stored_hashes())} of {len(wanted)} valid hashes not stored"
        )
        huge_hashes = {hash_hex(1000 + i) for i in range(3)}
        assert huge_hashes <= stored_hashes()  # the huge blocks too, without their tokens
        assert attach.metric("junction_bridge_table_resends_total") <= 1
        assert attach.metric("junction_bridge_bad_frames_total", reason="too_large") == 3
    finally:
        log = attach.stop()
        peer.close()
    assert "--outbox-bytes" in log and "without its token ids" in log
