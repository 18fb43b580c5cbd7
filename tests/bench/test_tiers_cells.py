"""`benchmarks/tiers_cells.py` on a tiny multi-tenant trace: a host tier adds hits to pools under
pressure, and an engine restarted on the same disk directory reads hits back from disk."""

from __future__ import annotations

from benchmarks.tiers_cells import (
    Rates,
    level_budget,
    run_cell,
    run_restart,
    tenant_requests,
)
from workloads import oracle

RATES = Rates(prefill_tokens_per_s=1e3, host_bytes_per_s=1e10, disk_bytes_per_s=1e9)


def test_host_tier_adds_hits_and_a_restart_reads_from_disk():
    requests = tenant_requests(
        num_tenants=3,
        sessions_per_tenant=2,
        num_steps=3,
        task_len=100,
        tool_output_len=120,
        action_len=20,
        seed=7,
    )
    assert {r.cache_salt for r in requests} == {"tenant-0", "tenant-1", "tenant-2"}
    budget, _ = level_budget(requests, 2)
    best = oracle(requests, 16).num_oracle_tokens
    cells = {
        host: run_cell("t", requests, budget, 2, host, False, RATES, best)[0] for host in (0, 8)
    }
    assert cells[8].hit_tokens > cells[0].hit_tokens
    assert cells[8].host_in > 0 and cells[8].host_out > 0 and cells[0].host_in == 0
    assert cells[8].hit_tokens <= best
    # no tiers: the modelled time is the prefill of every token not hit, nothing loaded
    assert cells[0].modelled_s == (cells[0].num_prompt_tokens - cells[0].hit_tokens) / 1e3

    cell, run = run_cell("t", requests, budget, 2, 0, True, RATES, best)
    assert cell.disk_in > 0 and cell.host_in == 0
    restart = run_restart("t", requests, budget, 2, 0, RATES, run)
    assert restart.disk_units_at_restart > 0
    assert restart.after_loaded_tokens > 0 and restart.after_disk_out > 0
