"""`junction bench --engine URL` against a real `junction serve --runner ledger` process."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from bench import BenchmarkSpec
from bench.remote import run_remote
from tests.bench.test_cli import bench

# `junction serve`'s own parser and command, in a process of its own
SERVE = (
    "import argparse, sys; from serve.cli import add_serve_parser; "
    "p = argparse.ArgumentParser(prog='junction'); "
    "add_serve_parser(p.add_subparsers(dest='command', required=True)); "
    "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE, "serve", "--runner", "ledger", "--port", str(port)]
        + ["--num-blocks", "1024", "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"junction serve exited: {process.stderr.read().decode()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("junction serve did not become healthy in 60 s")
            time.sleep(0.1)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def test_the_engine_row_reports_the_servers_hits(server_url, tmp_path, capsys):
    out = tmp_path / "results.json"
    code = bench(
        "--workload", "seed_shared_prefix", "--engine", server_url, "--out", str(out), "--quiet"
    )
    assert code == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert " engine " in captured.out and "modes and geometry do not" in captured.err
    results = json.loads(out.read_text())
    (row,) = results["modes"]
    assert row["mode"] == "engine" and row["num_requests"] == 3
    assert row["num_prompt_tokens"] == 3 * 1946
    # the server (fresh for this module) runs the defaults, junction checkpoints written inline:
    # the second request hits the first's state at 512 and leaves one at 560 the third hits
    assert row["num_cached_tokens"] == 512 + 560
    assert results["oracle"]["num_oracle_tokens"] == 2 * 560
    assert 0 < row["ttft_median_s"] <= row["ttft_p99_s"]
    assert row["forward_passes"] is None and row["peak_blocks_used"] is None


def test_concurrency_and_an_arrival_rate(server_url):
    spec = BenchmarkSpec.model_validate(
        {
            "name": "remote",
            "workload": {
                "kind": "prefix_repetition",
                "seed": 7,
                "num_prefixes": 2,
                "prefix_len": 64,
                "suffix_len": 16,
                "num_prompts": 8,
                "output_len": 2,
                "request_rate": 200,
            },
            "concurrency": 3,
        }
    )
    fractions: list[float] = []
    results = run_remote(spec, server_url, lambda f, m: fractions.append(f))
    row = results["modes"][0]
    assert row["num_requests"] == 8 and fractions[-1] == 1.0
    assert row["num_cached_tokens"] <= results["oracle"]["num_oracle_tokens"]


def test_an_unreachable_engine_fails_with_exit_1(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert bench("--workload", "seed_shared_prefix", "--engine", url, "--quiet") == 1
    assert "cannot list the models" in capsys.readouterr().err


def test_a_chat_workload_goes_through_chat_completions_and_hits_its_system_messages(server_url):
    spec = BenchmarkSpec.model_validate(
        {
            "name": "remote-chat",
            "workload": {
                "kind": "chat_shared_prefix",
                "seed": 3,
                "num_groups": 2,
                "prompts_per_group": 2,
                "system_prompt_len": 700,
                "question_len": 40,
                "output_len": 2,
                "shuffle": False,
            },
            "concurrency": 1,
        }
    )
    workload = spec.workload.build()
    system_end = workload.requests[0]["checkpoint_offsets"][0]
    results = run_remote(spec, server_url)
    (row,) = results["modes"]
    assert row["num_prompt_tokens"] == workload.num_prompt_tokens  # rendered as the trace is
    # the server's message checkpoints: each group's second request hits its whole system message
    assert row["num_cached_tokens"] == 2 * (system_end // 16 * 16)
    # the oracle also counts the user header and any leading characters the questions share
    assert row["num_cached_tokens"] <= results["oracle"]["num_oracle_tokens"]
