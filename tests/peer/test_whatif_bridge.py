"""A bridged vLLM engine's what-if: `junction attach vllm --recording-out` rebuilds each
request's prefix from the token ids of vLLM 0.33's own `BlockStored` events (its scheduler,
`KVCacheManager` and `ZmqEventPublisher`, benchmarks/peer/vllm_kv_events.py), and `junction
whatif` on that recording says what Junction's engine would have hit: the same hits, request by
request, as Junction's own replay of the prompts vLLM was sent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks.bridge import KvEventsPeer
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.traces.replay import replay
from engine.traces.trace import TraceRequest
from tests.polling import wait_until
from whatif.recording import load_lines
from whatif.run import run_whatif
from whatif.settings import WhatIfSetting

BLOCK = 16  # the peer's attention block (vllm_kv_events.py's default)


def block_prompts(seed: int, num_requests: int) -> list[list[int]]:
    """Families of prompts a whole number of blocks long, sharing prefixes that end inside
    Junction's and vLLM's larger blocks, each ending in a block of its own (so vLLM stores at
    least one block for it, and its stored prefix is its whole prompt). A later turn extends
    an earlier prompt but not the one just before it: vLLM's events name no request, and that
    one would read as the same request continued (attach/bridge/prefixes.py)."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 256, BLOCK * int(rng.integers(5, 40))).tolist() for _ in range(3)]
    prompts: list[list[int]] = []
    for _ in range(num_requests):
        if len(prompts) > 1 and rng.random() < 0.2:  # a later turn: an earlier prompt extended
            base = prompts[int(rng.integers(len(prompts) - 1))]
        else:
            base = prefixes[int(rng.integers(len(prefixes)))]
        suffix = rng.integers(0, 256, BLOCK * int(rng.integers(1, 12))).tolist()
        prompts.append(base + suffix)
    return prompts


@pytest.fixture
def peer():
    with KvEventsPeer(True) as vllm:
        yield vllm


def test_junction_would_hit_what_its_own_replay_of_the_same_prompts_hits(peer, tmp_path):
    recording_file = tmp_path / "recording.jsonl"
    log = tempfile.TemporaryFile(mode="w+")
    attach = subprocess.Popen(
        [
            sys.executable, "-m", "cli.main", "attach", "vllm",
            "--events", peer.events_url, "--replay", peer.replay_url,
            "--engine-id", "vllm-whatif", "--recording-out", str(recording_file),
            "--log-every", "0.2", "--log-level", "info",
        ],
        env={**os.environ}, stdout=subprocess.DEVNULL, stderr=log, text=True,
    )  # fmt: skip
    prompts = block_prompts(7, 24)
    try:
        assert wait_until(recording_file.exists, 60, 0.1), _log(attach, log)
        peer.replay(
            [{"id": f"r{i}", "prompt_token_ids": p, "max_tokens": 1} for i, p in enumerate(prompts)]
        )

        def rebuilt() -> int:
            return len(load_lines(recording_file.read_bytes().splitlines()).requests)

        assert wait_until(lambda: rebuilt() >= len(prompts), 60, 0.2), _log(attach, log)
    finally:
        attach.send_signal(signal.SIGTERM)
        attach.wait(30)
    recording = load_lines(Path(recording_file).read_bytes().splitlines())
    assert recording.geometry.kind == "vllm" and recording.geometry.is_peer
    assert [r.num_prompt_tokens for r in recording.requests] == [len(p) for p in prompts]
    # vLLM hit something (the families share), and never past a prompt
    assert 0 < sum(r.num_cached_tokens for r in recording.requests)
    assert all(r.num_cached_tokens < r.num_prompt_tokens for r in recording.requests)

    junction = (CacheConfig(num_blocks=2000, num_mamba_blocks=400), SchedulerConfig())
    report = run_whatif(recording, [WhatIfSetting(label="Junction")], base=junction)
    predicted = report.results[0].hits

    engine = Engine(*junction, runner="null")
    items = [TraceRequest(i, f"r{i}", p, 1, None, 1.0, 1.0, None) for i, p in enumerate(prompts)]
    records, _ = replay(engine, items)
    assert predicted == [r["num_cached_tokens"] for r in records]
    # Junction's partial hits find what vLLM's whole blocks cannot: the figure a user reads
    assert report.gain(report.results[0]) > 0


def _log(process: subprocess.Popen, log) -> str:
    if process.poll() is None:
        process.terminate()
        process.wait(10)
    log.seek(0)
    return log.read()
