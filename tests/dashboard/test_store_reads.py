"""What the dashboard reads beyond the existing REST: the block grid's columns, and each
finished request's block ids (engine `RequestFinished.block_ids`, stored by ingest)."""

from __future__ import annotations

import httpx

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import RequestFinished
from engine.request import SamplingParams
from engine.traces.trace import segment_tokens
from tests.api.processes import AUTH
from tests.dashboard.conftest import REPLAY_ENGINE, Stack


def test_grid_columns_equal_the_paged_block_rows(stack: Stack):
    for group in ("attention", "mamba"):
        grid = stack.get(f"/engines/{REPLAY_ENGINE}/blocks/grid", group=group, keys="true")
        rows = stack.get(f"/engines/{REPLAY_ENGINE}/blocks", group=group, limit=10000)["blocks"]
        assert grid["block_id"] == [row["block_id"] for row in rows]
        assert [grid["states"][s] for s in grid["state"]] == [row["state"] for row in rows]
        assert grid["keys"] == [row["keys"] for row in rows]
        ranges = [
            None if end is None else [start, end]
            for start, end in zip(grid["token_start"], grid["token_end"], strict=True)
        ]
        assert ranges == [row["token_range"] for row in rows]
        reasons = [None if r is None else grid["reasons"][r] for r in grid["checkpoint_reason"]]
        assert reasons == [row["checkpoint_reason"] for row in rows]
        assert grid["num_blocks"] == 320 if group == "attention" else 160


def test_grid_links_are_the_recent_copies_and_moves(stack: Stack):
    grid = stack.get(f"/engines/{REPLAY_ENGINE}/blocks/grid", group="mamba", link_batches=1000)
    events = stack.get("/events", engine_id=REPLAY_ENGINE, after_seq=-1, limit=1000)
    copies = [  # the requests' copies and the pin prefill's
        (ev["src_block_id"], ev["dst_block_id"], ev["path"])
        for batch in events["batches"]
        for ev in batch["events"]
        if ev["type"] == "BlockCopied" and ev["group"] == "mamba"
    ]
    by_requests = [c for line in stack.outputs.values() for c in line.get("cow_copies", [])]
    assert len(copies) >= len([c for c in by_requests if c["group"] == "mamba"]) > 0
    drawn = [(link["src"], link["dst"], link["path"]) for link in grid["links"]]
    assert sorted(d for d in drawn if d[2] is not None) == sorted(copies)
    window = stack.get(
        f"/engines/{REPLAY_ENGINE}/blocks/grid", group="mamba", start=2, stop=4, link_batches=0
    )
    assert window["block_id"] == [2, 3] and window["links"] == [] and window["keys"] is None


def test_grid_aggregates_above_max_cells_in_sql(stack: Stack):
    rows = stack.get(f"/engines/{REPLAY_ENGINE}/blocks", group="attention", limit=10000)["blocks"]
    grid = stack.get(
        f"/engines/{REPLAY_ENGINE}/blocks/grid", group="attention", max_cells=100, keys="true"
    )
    assert grid["blocks_per_cell"] == 4 and grid["block_id"] == [] and grid["keys"] is None
    expected: dict[int, dict[str, int]] = {}
    for row in rows:
        state = row["state"]
        if state == "cached":
            state = "cached_partial" if row["is_partial"] else "cached_full"
        if state != "free":
            counts = expected.setdefault(row["block_id"] // 4, {})
            counts[state] = counts.get(state, 0) + 1
    cells = grid["cells"]
    got = {}
    for i, cell in enumerate(cells["cell"]):
        counts = {
            name: cells[f"num_{name}"][i]
            for name in ("pinned", "in_use", "cached_full", "cached_partial")
            if cells[f"num_{name}"][i]
        }
        if counts:
            got[cell] = counts
    assert got == expected and got[0] == {"pinned": 4}


def test_grid_of_an_unknown_engine_is_a_404(stack: Stack):
    response = httpx.get(f"{stack.url}/api/v1/engines/nope/blocks/grid", headers=AUTH, timeout=10)
    assert response.status_code == 404 and "nope" in response.json()["detail"]


def test_requests_record_their_block_ids(stack: Stack):
    pin = stack.outputs["system"]
    q1 = stack.get(f"/engines/{REPLAY_ENGINE}/requests/q1")
    # q1 hit the pinned prefix: its table starts with the pin's attention blocks
    pinned = pin["block_ids"]["attention"]
    assert q1["block_ids"]["attention"][: len(pinned)] == pinned
    assert len(q1["block_ids"]["attention"]) == -(-q1["num_prompt_tokens"] // 16)


def test_request_finished_carries_the_table_before_it_is_freed():
    engine = Engine(
        CacheConfig(block_size=16, mamba_block_size=64, prefix_match_unit=16, num_blocks=64),
        SchedulerConfig(max_num_batched_tokens=256),
        runner="ledger",
    )
    engine.add_request(segment_tokens(1, 150), SamplingParams(max_tokens=2), request_id="r")
    coordinator = engine.scheduler.coordinator
    freed = {}
    free_request = coordinator.free_request

    def record(request_id: str) -> None:  # the tables as they are freed
        freed.update({m.group: list(m.tables[request_id]) for m in coordinator.managers})
        free_request(request_id)

    coordinator.free_request = record
    while engine.has_unfinished():
        engine.step()
    (finished,) = [e for e in engine.sink.events if isinstance(e, RequestFinished)]
    assert finished.block_ids == freed
    assert len(freed["attention"]) == 10 and any(b is not None for b in freed["mamba"])
