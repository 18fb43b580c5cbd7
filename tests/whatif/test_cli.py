"""`junction whatif` from a trace or a recording: the table, the JSON report, the errors."""

from __future__ import annotations

import json

from cli.main import main
from workloads import build_workload


def test_a_trace_is_recorded_then_replayed_under_each_setting(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(build_workload({"kind": "agentic"}).jsonl(with_pins=True))
    report, recording = tmp_path / "report.json", tmp_path / "recording.jsonl"
    args = ["whatif", "--trace", str(trace), "--num-blocks", "600", "--num-mamba-blocks", "150"]
    args += ["--concurrency", "8", "--try", "eviction=lru", "--try", "label=big,num_blocks=2400"]
    args += ["--json", str(report), "--recording-out", str(recording), "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "reproduce 32 of 32 requests' hits (exact)" in " ".join(out.split())
    data = json.loads(report.read_text())
    assert data["exact"] and data["num_requests"] == 32
    labels = [r["label"] for r in data["results"]]
    assert labels == ["big", "lru"]  # ranked: more memory saves the most
    assert data["results"][0]["gain_tokens"] > 0 and len(data["results"][0]["hits"]) == 32

    # the recording replays alone, with no trace, and draws its curve
    args = ["whatif", "--recording", str(recording), "--try", "num_blocks=2400", "--curve"]
    assert main([*args, "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "big" not in out and "hit rate against memory (reuse: full replays)" in out
    assert "│ 2,400 │ 600 │" in out  # four times the memory that ran, its LRU and reuse rates


def test_what_cannot_be_tried_is_said_with_exit_2(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(build_workload({"kind": "multi_turn"}).jsonl())
    base = ["whatif", "--trace", str(trace), "--num-blocks", "600", "--quiet"]
    assert main([*base, "--try", "prefix_match_unit=8,block_size=16"]) == 2
    assert "not a multiple of the recording's unit 16" in capsys.readouterr().err
    assert main([*base, "--try", "eviction"]) == 2
    assert "'eviction' is not key=value" in capsys.readouterr().err
    assert main([*base, "--try", "num_blocks=-3"]) == 2
    assert "num_blocks: Input should be greater than 0" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"geometry": {}, "unit": 16}\n{"id": 3}\n')
    assert main(["whatif", "--recording", str(bad)]) == 2
    assert "recording line 2 (a request)" in capsys.readouterr().err


def test_a_run_over_its_bounds_is_refused_before_it_starts(tmp_path, capsys, monkeypatch):
    """Issue 47, item 11: the estimate of a run's bytes and seconds is held to --max-bytes and
    --max-seconds (else JUNCTION_WHATIF_MAX_BYTES, _SECONDS): exit 2 naming the bound."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(build_workload({"kind": "multi_turn"}).jsonl())
    base = ["whatif", "--trace", str(trace), "--num-blocks", "600", "--quiet"]
    big = ["--try", "label=big,num_blocks=4194304,num_mamba_blocks=4194304"]
    assert main([*base, *big]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "over JUNCTION_WHATIF_MAX_BYTES (2.15 GB); its largest setting, 'big'" in err
    assert main([*base, "--try", "eviction=lru", "--max-bytes", "100000"]) == 2
    assert "over JUNCTION_WHATIF_MAX_BYTES (0.1 MB)" in capsys.readouterr().err
    monkeypatch.setenv("JUNCTION_WHATIF_MAX_SECONDS", "0.001")
    assert main([*base, "--try", "eviction=lru"]) == 2
    assert "over JUNCTION_WHATIF_MAX_SECONDS (0.001 s)" in capsys.readouterr().err
    assert main([*base, "--try", "eviction=lru", "--max-seconds", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--max-seconds (JUNCTION_WHATIF_MAX_SECONDS) must be positive, got -1.0" in err
    assert main([*base, "--try", "eviction=lru", "--max-seconds", "60"]) == 0
