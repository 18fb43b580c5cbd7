"""The engine server's `/metrics` carries the tiers below the device (docs/rules.md section 16):
a live server whose device pools are too small for its prompts' prefixes sends states down to
host memory, hits from there, and says so in `junction_tier_*`, while a server without tiers
shows none."""

from __future__ import annotations

import random

from prometheus_client.parser import text_string_to_metric_families

from engine.config import CacheConfig, SchedulerConfig, TierConfig
from engine.engine import Engine
from tests.serve.conftest import MAX_MODEL_LEN, MODEL, serve


def scrape(server) -> dict[tuple[str, tuple], float]:
    with server.http() as http:
        text = http.get("/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def engine(tiers: TierConfig | None) -> Engine:
    return Engine(
        CacheConfig(block_size=16, mamba_block_size=64, num_blocks=48, num_mamba_blocks=12),
        SchedulerConfig(max_num_batched_tokens=512, max_model_len=MAX_MODEL_LEN),
        runner="ledger",
        engine_id="engine-tiers",
        tiers=tiers,
    )


def send_families(server, seed: int = 0) -> None:
    """Six 300-token system prompts, each asked twice, far apart: the device's 768 tokens of
    attention cannot keep them all, host memory can."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 200) for _ in range(300)] for _ in range(6)]
    client = server.client()
    for round_ in range(2):
        for prefix in prefixes:
            prompt = prefix + [rng.randrange(1, 200) for _ in range(8 + round_)]
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)


def test_metrics_count_tier_saves_loads_and_bytes() -> None:
    for server in serve(engine(TierConfig(host_cache_bytes=1 << 26))):
        send_families(server)
        metrics = scrape(server)
        assert metrics[("junction_tier_saves_total", ())] > 0
        assert metrics[("junction_tier_loads_total", ())] > 0
        assert metrics[("junction_tier_loaded_tokens_total", ())] >= 256
        host = (("tier", "host"),)
        assert 0 < metrics[("junction_tier_bytes", host)] <= 1 << 26
        assert metrics[("junction_tier_capacity_bytes", host)] == 1 << 26
        assert metrics[("junction_tier_units", host)] > 0
        assert ("junction_tier_bytes", (("tier", "disk"),)) not in metrics
        # per tier, as vLLM names its offloading's: the tiering's hits, reads and read time
        assert metrics[("junction:kv_offload_tiering_block_hits_total", host)] > 0
        assert (
            metrics[("junction:kv_offload_tiering_hit_tokens_total", host)]
            == (metrics[("junction_tier_loaded_tokens_total", ())])
        )
        assert metrics[("junction:kv_offload_tiering_read_bytes_total", host)] > 0
        reads = metrics[("junction:kv_offload_tiering_read_time_seconds_count", host)]
        assert reads == metrics[("junction:kv_offload_tiering_block_hits_total", host)]
        inf = (("le", "+Inf"), ("tier", "host"))
        assert metrics[("junction:kv_offload_tiering_read_time_seconds_bucket", inf)] == reads
        assert 0 < metrics[("junction:kv_offload_cache_usage_perc", host)] <= 1


def test_no_tier_series_without_tiers() -> None:
    for server in serve(engine(None)):
        send_families(server)
        names = {name for name, _ in scrape(server)}
        assert not {n for n in names if n.startswith(("junction_tier_", "junction:kv_offload"))}
