"""`junction whatif` with tiers (issue 49, item 4): a `--try` of host and disk sizes reports the
hits each tier served, `--tier-curve` prints the hit rate against a tier's size, and a size
that is not bytes is refused naming the flag."""

from __future__ import annotations

import json

from cli.main import main
from tests.whatif.test_tiers import MULTI_TURN
from workloads import build_workload

MIB = 1 << 20


def test_tier_sizes_report_hits_by_tier_and_the_tier_curve(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(build_workload(MULTI_TURN).jsonl())
    report = tmp_path / "report.json"
    args = ["whatif", "--trace", str(trace), "--num-blocks", "300", "--num-mamba-blocks", "16"]
    args += ["--concurrency", "4", "--try", f"host_cache_bytes={MIB},disk_cache_bytes={16 * MIB}"]
    args += ["--tier-curve", "host", "--tier-sizes", f"0,{64 * MIB}", "--json", str(report)]
    assert main([*args, "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "host 1 MiB, disk 16 MiB" in out  # its row, with hit tokens from host and disk
    assert "hit rate against host size, the device pools as ran" in out
    (tried,) = json.loads(report.read_text())["results"]
    assert tried["label"] == "host 1 MiB, disk 16 MiB"
    assert tried["disk_hit_tokens"] > 0  # the disk served hits the device pools had given up
    assert tried["host_hit_tokens"] + tried["disk_hit_tokens"] == sum(map(sum, tried["tier_hits"]))
    assert main([*args[:-6], "--tier-curve", "disk", "--tier-sizes", "lots", "--quiet"]) == 2
    assert "--tier-sizes must be byte counts separated by commas" in capsys.readouterr().err
