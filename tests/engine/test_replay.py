"""`junction replay`: the trace forms, every output field, errors, and the issue's scenarios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main

GEOMETRY = ["--block-size", "16", "--mamba-block-size", "512", "--prefix-match-unit", "16"]
FIELDS = {
    "id",
    "num_prompt_tokens",
    "num_cached_tokens",
    "hit_tokens_by_group",
    "num_computed_tokens",
    "chunks",
    "checkpoints",
    "cow_copies",
    "output_token_ids",
    "ttft_s",
}


def write_trace(path: Path, lines: list[dict | str]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def segments(*parts: tuple[int, int]) -> dict:
    return {"segments": [{"seed": seed, "len": length} for seed, length in parts]}


def run(tmp_path: Path, lines: list, *options: str) -> list[dict]:
    trace = write_trace(tmp_path / "trace.jsonl", lines)
    out = tmp_path / "out.jsonl"
    code = main(["replay", str(trace), "--out", str(out), "--quiet", *options])
    assert code == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


MULTI_TURN = [
    {"id": "first", "prompt": segments((1, 10000)), "max_tokens": 1},
    {"id": "second", "prompt": segments((1, 10000), (2, 200)), "max_tokens": 1},
]


def test_extension_checkpoint_hits_10000_and_coarse_hits_9728(tmp_path):
    fine = run(tmp_path, MULTI_TURN, "--runner", "ledger", *GEOMETRY)
    assert fine[1]["num_cached_tokens"] == 10000
    assert 10000 in fine[0]["checkpoints"]
    coarse = run(tmp_path, MULTI_TURN, "--runner", "ledger", *GEOMETRY, "--no-partial-hits")
    assert coarse[1]["num_cached_tokens"] == 9728


SHARED_560 = [
    {"id": name, "prompt": segments((1, 560), (seed, 1386))}
    for name, seed in (("a", 11), ("b", 12), ("c", 13))
]


def test_junction_checkpoints_make_the_third_request_hit_560(tmp_path):
    with_junctions = run(
        tmp_path, SHARED_560, "--runner", "ledger", *GEOMETRY, "--junction-checkpoints"
    )
    assert [r["num_prompt_tokens"] for r in with_junctions] == [1946] * 3
    assert with_junctions[2]["num_cached_tokens"] == 560
    without = run(
        tmp_path,
        SHARED_560,
        "--runner",
        "ledger",
        *GEOMETRY,
        "--no-junction-checkpoints",
        "--checkpoint-mode",
        "stops",
    )
    assert without[2]["num_cached_tokens"] < 560


def test_every_output_field_and_the_three_prompt_forms(tmp_path):
    records = run(
        tmp_path,
        [
            {"id": "seg", "prompt": segments((3, 40)), "max_tokens": 3},
            {"id": "text", "prompt": "hello, hybrid world", "max_tokens": 2},
            {"id": "ids", "prompt_token_ids": [1, 2, 3, 4, 5], "max_tokens": 1},
        ],
        "--runner",
        "ledger",
        "--block-size",
        "4",
        "--mamba-block-size",
        "8",
    )
    assert [r["id"] for r in records] == ["seg", "text", "ids"]
    for record in records:
        assert FIELDS <= set(record)
        assert record["hit_tokens_by_group"].keys() == {"attention", "mamba"}
        assert record["ttft_s"] is not None and record["ttft_s"] >= 0
    assert records[1]["num_prompt_tokens"] == len(b"hello, hybrid world")
    assert [len(r["output_token_ids"]) for r in records] == [3, 2, 1]


def test_cache_off_gives_the_same_tokens(tmp_path):
    lines = [
        {"id": str(i), "prompt": segments((1, 300), (i, 50)), "max_tokens": 4} for i in range(2, 8)
    ]
    options = [
        "--runner",
        "ledger",
        "--block-size",
        "4",
        "--mamba-block-size",
        "32",
        "--concurrency",
        "3",
        "--num-blocks",
        "200",
        "--junction-checkpoints",
    ]
    on = run(tmp_path, lines, *options)
    off = run(tmp_path, lines, *options, "--no-prefix-caching")
    assert sum(r["num_cached_tokens"] for r in on) > 0
    assert sum(r["num_cached_tokens"] for r in off) == 0
    assert [r["output_token_ids"] for r in on] == [r["output_token_ids"] for r in off]


def test_pin_lines_are_materialized_before_the_next_line(tmp_path):
    records = run(
        tmp_path,
        [
            {"pin": segments((1, 560)), "id": "system"},
            {"id": "q", "prompt": segments((1, 560), (5, 100))},
        ],
        "--runner",
        "ledger",
        *GEOMETRY,
    )
    assert records[0]["type"] == "pin" and records[0]["state"] == "materialized"
    assert records[0]["boundary"] == 560
    assert records[1]["num_cached_tokens"] == 560


def test_snapshot_out_lists_every_block_of_both_groups(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", MULTI_TURN)
    snap = tmp_path / "snap.json"
    assert (
        main(
            [
                "replay",
                str(trace),
                "--quiet",
                "--out",
                str(tmp_path / "o.jsonl"),
                "--snapshot-out",
                str(snap),
                "--num-blocks",
                "1000",
                *GEOMETRY,
            ]
        )
        == 0
    )
    data = json.loads(snap.read_text())
    assert data["geometry"]["prefix_match_unit"] == 16
    blocks = data["blocks"]
    assert len(blocks) == 2000
    cached = [b for b in blocks if b["keys"]]
    assert {b["group"] for b in cached} == {"attention", "mamba"}
    assert all(b["state"] in ("free", "cached") and b["ref_cnt"] == 0 for b in blocks)
    assert all((b["state"] == "cached") == bool(b["keys"]) for b in blocks)
    mamba = {b["token_range"][1]: b for b in cached if b["group"] == "mamba"}
    assert mamba[10000]["checkpoint_reason"] == "extension"
    assert mamba[10000]["is_partial"] is True


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ('{"id": "x", "prompt": {"segments": [{"seed": 1, "len": 0}]}}', "line 2: prompt"),
        ('{"id": "x"}', 'line 2: line: Value error, give exactly one of "prompt"'),
        ('{"id": "x", "prompt": "a", "max_tokens": 0}', "line 2: max_tokens"),
        ('{"id": "x", "promt": "a"}', "line 2: promt: Extra inputs are not permitted"),
        ('{"id": "a", "prompt": "again"}', "line 2: id 'a' repeats line 1"),
        ('{"id": "' + "r" * 300 + '", "prompt": "a"}', "line 2: id: Value error, at most 256"),
        ('{"id": "a\\u0000b", "prompt": "a"}', "line 2: id: Value error, must be non-empty"),
        ('{"pin": "text", "id": "p\\nq"}', "line 2: id: Value error, must be non-empty"),
    ],
)
def test_malformed_line_names_the_line_and_writes_nothing(tmp_path, capsys, line, message):
    trace = write_trace(tmp_path / "bad.jsonl", [{"id": "a", "prompt": "fine"}, line])
    out = tmp_path / "out.jsonl"
    assert main(["replay", str(trace), "--out", str(out), "--quiet"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [trace]


def test_a_bad_geometry_is_reported_not_raised(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.jsonl", [{"prompt": "x"}])
    assert (
        main(
            [
                "replay",
                str(trace),
                "--block-size",
                "16",
                "--mamba-block-size",
                "512",
                "--prefix-match-unit",
                "24",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "24" in err and "16" in err and "512" in err


def test_console_script_runs_a_trace_to_stdout(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", [{"id": "a", "prompt": "abc", "max_tokens": 2}])
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "replay", str(trace), "--runner", "null"],
        capture_output=True,
        text=True,
        check=True,
    )
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert record["id"] == "a" and len(record["output_token_ids"]) == 2
    assert "1 requests, hit 0/3 prompt tokens" in done.stderr


def test_out_to_a_device_writes_through_it_and_leaves_it_a_device(tmp_path):
    import os
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    trace = write_trace(tmp_path / "t.jsonl", [{"id": "a", "prompt": "abc"}])
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    assert main(["replay", str(trace), "--out", str(fifo), "--quiet"]) == 0
    assert json.loads(reader.communicate(timeout=10)[0])["id"] == "a"
    assert stat.S_ISFIFO(fifo.stat().st_mode)


FAMILY = [
    {"id": f"r{i}", "prompt": segments((1, 700), (20 + i, 50 + 97 * i)), "max_tokens": 1 + i % 5}
    for i in range(12)
]


def test_events_out_streams_every_event_and_rebuilds_the_table(tmp_path):
    """`--events-out` writes the events as they happen; their block rows, applied over a table
    of free blocks, give the final table `--snapshot-out` writes."""
    events_path, snapshot_path = tmp_path / "events.jsonl", tmp_path / "table.json"
    records = run(
        tmp_path,
        FAMILY,
        "--runner",
        "ledger",
        *GEOMETRY,
        "--num-blocks",
        "200",
        "--concurrency",
        "3",
        "--events-out",
        str(events_path),
        "--snapshot-out",
        str(snapshot_path),
    )
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    types = {event["type"] for event in events}
    assert {"BlockStored", "BlockRemoved", "BlockStateChanged", "RequestFinished"} <= types
    finished = [e["request_id"] for e in events if e["type"] == "RequestFinished"]
    assert sorted(finished) == sorted(r["id"] for r in records)
    table = json.loads(snapshot_path.read_text())
    mirror = {
        (group, block_id): None
        for group, shape in table["groups"].items()
        for block_id in range(shape["num_blocks"])
    }
    for event in events:
        if event["type"] == "BlockStateChanged":
            mirror.update(((row["group"], row["block_id"]), row) for row in event["blocks"])
    changed = [row for row in table["blocks"] if row["last_change"] > 0]
    assert changed and all(mirror[(r["group"], r["block_id"])] == r for r in changed)


def test_records_come_in_trace_order_at_any_concurrency(tmp_path):
    one = run(tmp_path, FAMILY, "--runner", "ledger", *GEOMETRY)
    four = run(tmp_path, FAMILY, "--runner", "ledger", *GEOMETRY, "--concurrency", "4")
    assert [r["id"] for r in four] == [r["id"] for r in one] == [x["id"] for x in FAMILY]
    assert [r["output_token_ids"] for r in four] == [r["output_token_ids"] for r in one]


def test_without_a_listener_the_engine_builds_no_events():
    from engine.config import CacheConfig
    from engine.engine import Engine
    from engine.events import NullSink
    from engine.traces.replay import replay
    from engine.traces.trace import parse_line

    items = [parse_line(json.dumps(line), n) for n, line in enumerate(FAMILY, start=1)]
    engine = Engine(CacheConfig(num_blocks=200), runner="ledger", sink=NullSink())
    records, _ = replay(engine, items, concurrency=3)
    pools = engine.scheduler.coordinator.pools.values()
    assert all(not pool.dirty for pool in pools)  # no changed rows were even tracked
    assert sum(r["num_cached_tokens"] for r in records) > 0


def test_a_closed_stdout_ends_the_replay_quietly(tmp_path):
    trace = write_trace(tmp_path / "trace.jsonl", FAMILY)
    shell = f"{sys.executable} -m cli.main replay {trace} --runner ledger | head -c 10"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    assert done.stdout == '{"type":"r'
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
