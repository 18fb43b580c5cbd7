"""The bridge against a peer in process: batches applied once each and in order, gaps filled
from the replay or said as `PeerResync`, and bad input (garbage frames, an unknown event tag,
a seq going backwards, a publisher restart) each logged and counted, the bridge carrying on
with the next good batch."""

from __future__ import annotations

import logging

import msgspec

from attach.bridge.stream import BAD_BATCH, MAX_SEQ_JUMP, NO_REPLAY, NOT_HELD, RESTART
from engine.events import PeerBlockRemoved, PeerBlockStored, PeerCacheCleared, PeerResync
from tests.attach.conftest import FakePeer, Harness, removed, stored


def hashes(events, kind=PeerBlockStored) -> list[str]:
    return [h for e in events if type(e) is kind for h in e.block_hashes]


def resyncs(events) -> list[tuple[int, int, str]]:
    return [(e.first_missing_seq, e.resumed_seq, e.reason) for e in events if type(e) is PeerResync]


def test_batches_in_order_become_peer_events(peer: FakePeer, harness: Harness) -> None:
    peer.publish([stored([1, 2]), stored([b"\x0a" * 32], group_idx=1, kind="mamba")])
    peer.publish([removed([1]), {"type": "AllBlocksCleared"}])
    first, mamba, gone, cleared = harness.pump()
    assert first == PeerBlockStored(
        rank=0,
        group_idx=0,
        group="attention",
        medium="GPU",
        block_hashes=["01", "02"],
        parent_block_hash=None,
        block_size=4,
        token_ids=list(range(8)),
    )
    assert mamba.group == "mamba" and mamba.block_hashes == ["0a" * 32]
    assert gone == PeerBlockRemoved(
        rank=0, group_idx=0, group="attention", medium="GPU", block_hashes=["01"]
    )
    assert cleared == PeerCacheCleared(rank=0)
    assert harness.value("junction_bridge_batches_total", rank="0") == 2
    assert harness.value("junction_bridge_events_total", rank="0") == 4


def test_a_late_bridge_starts_from_the_replay(peer: FakePeer) -> None:
    for h in range(5):
        peer.publish([stored([h])])
    h = Harness(peer)
    peer.publish([stored([5])])
    h.pump()
    assert hashes(h.events) == ["00", "01", "02", "03", "04", "05"]
    assert h.value("junction_bridge_replayed_batches_total", rank="0") == 5
    assert resyncs(h.events) == []
    h.bridge.close()


def test_a_late_bridge_whose_replay_lost_the_start_resyncs(caplog) -> None:
    peer = FakePeer(buffer_steps=2)
    for h in range(5):
        peer.publish([stored([h])])
    with caplog.at_level(logging.WARNING, "attach.bridge"):
        h = Harness(peer)
        h.pump()
    events = h.events
    assert resyncs(events) == [(0, 3, NOT_HELD)]
    assert hashes(events) == ["03", "04"]
    assert "lost seqs 0..2 (the replay no longer holds them)" in caplog.text
    h.bridge.close()
    peer.close()


def test_a_gap_is_filled_from_the_replay(peer: FakePeer, harness: Harness) -> None:
    harness.drops = {1, 2}
    for h in range(5):
        peer.publish([stored([h])])
    events = harness.pump()
    assert hashes(events) == ["00", "01", "02", "03", "04"] and resyncs(events) == []
    assert harness.value("junction_bridge_gaps_total", rank="0") == 1
    # 1, 2, 3 and 4 if it was out when the replay answered; the live ones after 2 are skipped
    replayed = harness.value("junction_bridge_replayed_batches_total", rank="0")
    assert replayed in (3, 4)
    assert harness.value("junction_bridge_duplicates_total", rank="0") == replayed - 2
    assert harness.bridge.streams[0].next_seq == 5


def test_a_gap_the_replay_no_longer_holds_is_a_resync(caplog) -> None:
    peer = FakePeer(buffer_steps=2)
    h = Harness(peer)
    peer.publish([stored([0])])
    h.pump()
    for n in range(1, 5):
        peer.publish([stored([n])], live=False)  # lost on the live socket
    peer.publish([stored([5])])
    with caplog.at_level(logging.WARNING, "attach.bridge"):
        events = h.pump()
    assert resyncs(events) == [(1, 4, NOT_HELD)]
    assert hashes(events) == ["04", "05"]  # what the replay still held, then the live one
    assert h.value("junction_bridge_resyncs_total", rank="0", reason=NOT_HELD) == 1
    assert "seqs 1..4 missing on the live socket" in caplog.text
    h.bridge.close()
    peer.close()


def test_without_a_replay_a_gap_is_a_resync() -> None:
    peer = FakePeer(replay=False)
    h = Harness(peer, use_replay=False)
    peer.publish([stored([0])])
    peer.seq = 3
    peer.publish([stored([3])])
    events = h.pump()
    assert resyncs(events) == [(1, 3, NO_REPLAY)] and hashes(events) == ["00", "03"]
    h.bridge.close()
    peer.close()


def test_garbage_frames_are_logged_counted_and_skipped(peer, harness, caplog) -> None:
    peer.publish([stored([0])])
    with caplog.at_level(logging.WARNING, "attach.bridge"):
        peer.pub.send_multipart([b"only", b"two"])
        peer.pub.send_multipart([b"", b"short", b"x"])
        peer.send(1, b"\xc1 not msgpack")
        peer.send(2, msgspec.msgpack.encode({"not": "a batch"}))
        peer.publish([stored([3])])
        events = harness.pump()
    assert hashes(events) == ["00", "03"]
    assert resyncs(events) == [(1, 2, BAD_BATCH), (2, 3, BAD_BATCH)]
    for reason, count in (("parts", 1), ("seq", 1), ("payload", 2)):
        assert harness.value("junction_bridge_bad_frames_total", reason=reason) == count, reason
    assert "a message of 2 frames" in caplog.text
    assert "a seq frame of 5 bytes" in caplog.text
    assert "seq 1: not a KV event batch" in caplog.text


def test_an_unknown_event_tag_is_skipped_and_its_batch_kept(peer, harness, caplog) -> None:
    with caplog.at_level(logging.WARNING, "attach.bridge"):
        peer.publish([stored([0]), {"type": "BlockTeleported", "to": "mars"}, removed([0])])
        peer.publish([stored([1])])
        events = harness.pump()
    assert hashes(events) == ["00", "01"] and hashes(events, PeerBlockRemoved) == ["00"]
    assert harness.value("junction_bridge_bad_frames_total", reason="event") == 1
    assert "unknown event tag 'BlockTeleported'" in caplog.text


def forge(peer: FakePeer, seq: int, events: list) -> None:
    """A message on the live socket at `seq` that the peer never published (its replay does
    not hold it, its own seq does not move)."""
    payload = msgspec.msgpack.encode([1.5, events, 0])
    peer.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])


def test_a_seq_going_backwards_that_the_replay_contradicts_is_dropped(peer, harness, caplog):
    for h in range(4):
        peer.publish([stored([h])])
    harness.pump()
    with caplog.at_level(logging.WARNING, "attach.bridge"):
        forge(peer, 2, [stored([9])])  # not what seq 2 was
        assert harness.pump() == []
    assert harness.value("junction_bridge_bad_frames_total", reason="forged") == 1
    assert harness.value("junction_bridge_restarts_total", rank="0") == 0
    assert "seq 2 dropped: a seq back from 3 the replay does not hold" in caplog.text
    peer.publish([stored([10])])
    assert hashes(harness.pump()) == ["0a"]
    assert harness.bridge.table.hashes(0) == {"attention": {"00", "01", "02", "03", "0a"}}


def test_without_a_replay_a_seq_going_backwards_is_taken_for_a_restart(caplog) -> None:
    peer = FakePeer(replay=False)
    harness = Harness(peer, use_replay=False)
    for h in range(4):
        peer.publish([stored([h])])
    harness.pump()
    with caplog.at_level(logging.WARNING, "attach.bridge"):
        peer.publish([stored([9])], seq=2)
        events = harness.pump()
    assert harness.value("junction_bridge_bad_frames_total", reason="seq_backwards") == 1
    assert harness.value("junction_bridge_restarts_total", rank="0") == 1
    assert "seq went backwards from 3 to 2" in caplog.text
    assert events[0] == PeerCacheCleared(rank=0)
    assert resyncs(events) == [(4, 2, RESTART), (0, 2, NO_REPLAY)]
    assert hashes(events) == ["09"]
    harness.bridge.close()
    peer.close()


def test_a_lone_seq_far_ahead_is_dropped_and_a_real_jump_is_followed(peer, harness, caplog):
    """A forged seq of 2^62 would make every real message after it look like a restart."""
    for h in range(4):
        peer.publish([stored([h])])
    harness.pump()
    with caplog.at_level(logging.WARNING, "attach.bridge"):
        forge(peer, 1 << 62, [{"type": "AllBlocksCleared"}])
        peer.publish([stored([4])])
        events = harness.pump()
    assert hashes(events) == ["04"] and PeerCacheCleared(rank=0) not in events
    assert harness.value("junction_bridge_bad_frames_total", reason="forged") == 1
    assert harness.value("junction_bridge_restarts_total", rank="0") == 0
    assert f"seq {1 << 62} dropped" in caplog.text
    far = 5 + MAX_SEQ_JUMP + 1  # a real jump (the live socket lost that much): its next follows
    peer.seq = far
    peer.publish([stored([5])])
    peer.publish([stored([6])])
    events = harness.pump()
    assert hashes(events) == ["05", "06"] and resyncs(events) == [(5, far, NOT_HELD)]


def test_a_cache_clear_the_replay_does_not_hold_is_dropped(peer, harness, caplog) -> None:
    peer.publish([stored([0])])
    harness.pump()
    with caplog.at_level(logging.WARNING, "attach.bridge"):
        forge(peer, 1, [{"type": "AllBlocksCleared"}])  # at the very seq wanted next
        peer.publish([stored([1])])  # the real seq 1
        events = harness.pump()
    assert PeerCacheCleared(rank=0) not in events and hashes(events) == ["01"]
    assert "seq 1 dropped: a cache clear the replay does not hold" in caplog.text
    assert harness.bridge.table.hashes(0) == {"attention": {"00", "01"}}
    peer.publish([{"type": "AllBlocksCleared"}])  # a real one clears
    assert harness.pump() == [PeerCacheCleared(rank=0)]


def test_a_publisher_restart_clears_the_rank_and_carries_on(peer, harness, caplog) -> None:
    for h in range(3):
        peer.publish([stored([h])])
    harness.pump()
    peer.restart()
    with caplog.at_level(logging.WARNING, "attach.bridge"):
        peer.publish([stored([7])])
        peer.publish([stored([8])])
        events = harness.pump()
    assert events[0] == PeerCacheCleared(rank=0)
    assert resyncs(events) == [(3, 0, RESTART)]
    assert hashes(events) == ["07", "08"]
    assert harness.bridge.table.hashes(0) == {"attention": {"07", "08"}}
    assert harness.value("junction_bridge_restarts_total", rank="0") == 1
    assert "seq back to 0 after 2: the publisher restarted" in caplog.text


def test_duplicates_from_a_replay_are_not_taken_for_a_restart(peer, harness) -> None:
    harness.drops = {0}
    peer.publish([stored([0])])
    peer.publish([stored([1])])
    peer.publish([stored([2])])
    events = harness.pump()
    assert hashes(events) == ["00", "01", "02"] and resyncs(events) == []
    assert harness.value("junction_bridge_restarts_total", rank="0") == 0


def test_sglang_arrays_and_replay_frames_without_a_topic() -> None:
    peer = FakePeer(sglang=True)
    peer.publish([["BlockStored", [1], None, [1, 2], 2, None]])
    h = Harness(peer, flavor="sglang")  # seq 0 comes from the replay
    peer.publish([["BlockStored", [2], 1, [3, 4], 2, None, "GPU"], ["BlockRemoved", [1]]])
    h.pump()
    assert hashes(h.events) == ["01", "02"] and hashes(h.events, PeerBlockRemoved) == ["01"]
    assert h.bridge.table.hashes(0) == {"attention": {"02"}}
    h.bridge.close()
    peer.close()


def test_each_rank_on_its_own_ports(tmp_path) -> None:
    base = f"ipc://{tmp_path}/kv"
    replay = f"ipc://{tmp_path}/replay"
    ranks = [FakePeer(events_url=base, replay_url=replay)]
    ranks.append(FakePeer(events_url=f"{base}_dp1", replay_url=f"{replay}_dp1"))
    ranks[0].events_url, ranks[0].replay_url = base, replay
    h = Harness(ranks[0], others=ranks[1:], num_ranks=2)
    ranks[0].publish([stored([1])])
    ranks[1].publish([stored([2])], rank=1)
    ranks[1].restart()
    ranks[1].publish([stored([3])], rank=1)
    events = h.pump()
    assert {(e.rank, e.block_hashes[0]) for e in events if type(e) is PeerBlockStored} == {
        (0, "01"),
        (1, "02"),
        (1, "03"),
    }
    assert PeerCacheCleared(rank=1) in events and PeerCacheCleared(rank=0) not in events
    assert h.bridge.table.hashes(0) == {"attention": {"01"}}
    assert h.bridge.table.hashes(1) == {"attention": {"03"}}
    h.bridge.close()
    for peer in ranks:
        peer.close()


def test_a_failed_handshake_gets_a_new_live_socket(tmp_path, caplog) -> None:
    """What a SUB that reconnected to its own port meets: a socket of the wrong type (libzmq
    then never reconnects it by itself)."""
    import zmq

    from attach.bridge.bridge import Bridge, BridgeConfig

    url = f"ipc://{tmp_path}/kv"
    context = zmq.Context()
    try:  # a context left with open sockets would hang the interpreter at exit
        wrong = context.socket(zmq.ROUTER)
        wrong.bind(url)
        events: list = []
        bridge = Bridge(BridgeConfig(events=url, poll_ms=20), events.extend, context=context)
        with caplog.at_level(logging.INFO, "attach.bridge"):
            bridge.open()
            for _ in range(50):
                bridge.run_once()
            assert f"the live socket lost its peer (DISCONNECTED at {url})" in caplog.text
        wrong.close(0)
        peer = FakePeer(replay=False, events_url=url)
        for _ in range(75):  # a new SUB at most once a second
            bridge.run_once()
        peer.wait_subscribed()
        peer.publish([stored([1])])
        for _ in range(20):
            bridge.run_once()
        assert hashes(events) == ["01"]
        assert len(bridge.sockets) == 1 and len(bridge.monitors) == 1
        bridge.close()
        peer.close()
    finally:
        context.destroy(0)
