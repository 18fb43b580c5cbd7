"""A fake vLLM engine in the dashboard's stack, fed as `junction attach vllm` feeds one: its
hello (`"physical_block_ids": false`) and batches of peer events over the ingest socket.

Its cache is the hand-built forest of `tests.api.test_peer_analysis` (a 560-token system
prompt parting three ways, one of them again at 720; a 160-token prefix parting two ways;
Mamba states at 528 and 160), stored over the last ten minutes in batches a minute apart, the
160-token family also offloaded to the CPU tier, a few blocks stored then removed, a scrape of
the prefix-cache counters per batch, and one gap the bridge could not fill.
"""

from __future__ import annotations

import json
import time

from websockets.sync.client import connect

from engine.wire import encode
from tests.api.processes import TOKEN
from tests.api.test_peer_analysis import chain, forest, hex_hash, peer_frames
from tests.dashboard.conftest import Stack

PEER_ENGINE = "vllm-0"
NUM_BATCHES = 10


def peer_batches(now: float) -> list[dict]:
    """The hello, then `NUM_BATCHES` batches a minute apart ending at `now`."""
    rows = forest()
    rows += [{**row, "medium": "CPU"} for row in rows if row["hash"][0] in "ghi"]
    hello, stored = peer_frames(PEER_ENGINE, rows)
    events = stored["events"]
    gone = chain("x", 6, None)
    _, gone_frame = peer_frames(PEER_ENGINE, gone)
    removed = {
        "type": "PeerBlockRemoved",
        "rank": 0,
        "group_idx": 0,
        "group": "attention",
        "medium": "GPU",
        "block_hashes": [hex_hash(row["hash"]) for row in gone],
    }
    per_batch = -(-len(events) // (NUM_BATCHES - 2))
    batches = []
    queries = hits = 0.0
    for seq in range(NUM_BATCHES):
        ts = now - 60.0 * (NUM_BATCHES - 1 - seq)
        part = events[seq * per_batch : (seq + 1) * per_batch]
        if seq == 2:
            part = part + gone_frame["events"]
        if seq == 6:
            part = part + [removed]
        if seq == 7:
            resync = {
                "first_missing_seq": 41,
                "resumed_seq": 44,
                "reason": "replay no longer held them",
            }
            part = part + [{"type": "PeerResync", "rank": 0, **resync}]
        queries += 4000.0
        hits += 4000.0 * min(0.15 + 0.08 * seq, 0.8)
        metrics = {"rank": 0, "scraped_ts": ts, "queries_tokens": queries, "hits_tokens": hits}
        part = part + [{"type": "PeerMetrics", **metrics, "usage": 0.1 + 0.05 * seq}]
        frame = {"type": "batch", "engine_id": PEER_ENGINE, "epoch": 1, "seq": seq, "ts": ts}
        batches.append(frame | {"events": part})
    return [hello, *batches]


def ensure_peer_engine(stack: Stack) -> None:
    """Stream the fake vLLM engine into the stack once (a later call finds it there)."""
    if any(e["engine_id"] == PEER_ENGINE for e in stack.get("/engines")):
        return
    hello, *batches = peer_batches(time.time())
    url = stack.url.replace("http://", "ws://") + "/api/v1/ingest"
    with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        ws.send(encode(hello))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        for batch in batches:
            ws.send(encode(batch))
            while (answer := json.loads(ws.recv(timeout=30)))["type"] == "command":
                pass  # active pins other tests made, sent to every engine after its hello
            assert answer == {"type": "ack", "seq": batch["seq"]}, answer
