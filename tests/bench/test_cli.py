"""`junction bench`: a table of every mode, exit 2 on a bad spec, nothing written on failure."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.cli import add_bench_parser
from engine.runners.ledger import LedgerRunner
from engine.setup.options import EXIT_BAD_INPUT, EXIT_FAILED
from engine.traces.trace import TracePin, read_trace

SPEC = {
    "name": "cli-tiny",
    "workload": {
        "kind": "generated_shared_prefix",
        "num_groups": 2,
        "prompts_per_group": 3,
        "system_prompt_len": 80,
        "question_len": 30,
        "output_len": 2,
    },
    "geometry": {"block_size": 16, "mamba_block_size": 64, "num_blocks": 128},
    "concurrency": 2,
}


def bench(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="junction")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def write(path: Path, obj) -> Path:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def test_a_spec_file_prints_every_mode_and_writes_the_results(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert bench(str(write(tmp_path / "spec.json", SPEC)), "--out", str(out), "--quiet") == 0
    table = capsys.readouterr().out
    for header in ("mode", "hit rate", "oracle", "TTFT p50 ms", "peak blocks"):
        assert header in table
    for mode in ("off", "aligned", "partial", "junction", "junction_inline", "pins"):
        assert f" {mode} " in table
    results = json.loads(out.read_text())
    assert results["name"] == "cli-tiny" and len(results["modes"]) == 6
    pins = next(r for r in results["modes"] if r["mode"] == "pins")
    assert f"{pins['hit_rate']:.1%}" in table


def test_overrides_on_the_command_line(tmp_path, capsys):
    out, trace = tmp_path / "r.json", tmp_path / "trace.jsonl"
    code = bench(
        "--workload",
        "seed_shared_prefix",
        "--set",
        "shared_len=320",
        "--set",
        "geometry.num_blocks=512",
        "--modes",
        "partial,junction",
        "--out",
        str(out),
        "--trace-out",
        str(trace),
        "--quiet",
    )
    assert code == 0, capsys.readouterr().err
    results = json.loads(out.read_text())
    assert [r["mode"] for r in results["modes"]] == ["partial", "junction"]
    assert results["workload"]["params"]["shared_len"] == 320
    assert results["geometry"]["num_blocks"] == 512
    assert results["modes"][1]["num_cached_tokens"] == 320  # the third request's junction
    items = read_trace(trace)  # what `junction replay` reads
    assert isinstance(items[0], TracePin) and len(items) == 4


@pytest.mark.parametrize(
    ("spec", "argv", "message"),
    [
        ("{not json", [], "is not valid JSON"),
        ("[1, 2]", [], "must be a JSON object"),
        ({**SPEC, "modes": ["off", "turbo"]}, [], "modes.1"),
        ({**SPEC, "geometry": {"prefix_match_unit": 3}}, [], "must divide"),
        (SPEC, ["--set", "num_groups=0"], "num_groups"),
        (SPEC, ["--set", "nokey"], "--set expects KEY=VALUE"),
        (SPEC, ["--concurrency", "0"], "concurrency"),
        (None, [], "give a SPEC file or --workload KIND"),
    ],
)
def test_a_bad_spec_exits_2_and_writes_nothing(tmp_path, capsys, spec, argv, message):
    out = tmp_path / "results.json"
    args = [] if spec is None else [str(write(tmp_path / "spec.json", spec))]
    assert bench(*args, *argv, "--out", str(out), "--quiet") == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and err.startswith("junction bench")
    assert not out.exists()


def test_a_missing_spec_file_exits_2(tmp_path, capsys):
    assert bench(str(tmp_path / "absent.json"), "--quiet") == EXIT_BAD_INPUT
    assert "cannot read spec" in capsys.readouterr().err


def test_a_wrong_reuse_exits_1_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(LedgerRunner, "copy_block", lambda self, copy: None)
    out = tmp_path / "results.json"
    code = bench("--workload", "seed_shared_prefix", "--modes", "junction", "--out", str(out))
    assert code == EXIT_FAILED
    assert "the ledger found a wrong reuse" in capsys.readouterr().err
    assert not out.exists()


def test_junction_registers_bench(capsys):
    from cli.main import main

    assert main(["bench", "--workload", "seed_multi_turn", "--modes", "partial", "--quiet"]) == 0
    assert " partial " in capsys.readouterr().out
