"""A what-if run on a worker tries tier sizes as the CLI does (issue 49, item 4): settings with
`host_cache_bytes` and `disk_cache_bytes` queued through the store are replayed with those tiers,
and the stored report says, per setting, the hit tokens host memory and the disk served: what
the same what-if run here gives."""

from __future__ import annotations

from api.whatif.recording import load_recording
from jobs import whatif
from tests.jobs.test_whatif_runs import engine_run, load, queue, sessions  # noqa: F401
from whatif.run import run_whatif
from whatif.settings import parse_settings

MIB = 1 << 20
TIERED = [
    {"label": "host", "host_cache_bytes": 4 * MIB},
    {"label": "host and disk", "host_cache_bytes": MIB, "disk_cache_bytes": 8 * MIB},
]


def test_a_run_with_tiers_reports_the_hits_each_tier_served(sessions, engine_run):  # noqa: F811
    run_id = queue(sessions, engine_run, TIERED)
    whatif.run_whatif_run(run_id, sessions=sessions)
    run = load(sessions, run_id)
    assert run.status == "done", run.error
    stored = {r["label"]: r for r in run.result["results"]}
    with sessions() as session:
        recording = load_recording(session, engine_run.engine_id, engine_run.epoch)
    here = run_whatif(recording, parse_settings(TIERED))
    for result in here.results:
        got = stored[result.label]
        assert got["changes"]["host_cache_bytes"] == result.changes["host_cache_bytes"]
        assert (got["hit_tokens"], got["host_hit_tokens"], got["disk_hit_tokens"]) == (
            result.hit_tokens, result.host_hit_tokens, result.disk_hit_tokens,
        )  # fmt: skip
        assert got["device_hit_tokens"] == result.hit_tokens - sum(map(sum, result.tier_hits))
    # the engine's pools were short: the tiers served hits the device alone did not
    assert sum(r.host_hit_tokens + r.disk_hit_tokens for r in here.results) > 0
    assert run.result["as_ran"]["host_hit_tokens"] == 0  # what ran is replayed without tiers
