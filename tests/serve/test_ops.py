"""`/v1/models`, `/health`, `/metrics` and `/debug/blocks`."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.serve.conftest import MODEL, text_prompt

METRIC_NAMES = (
    "junction_prefix_cache_queries_tokens_total",
    "junction_prefix_cache_hits_tokens_total",
    "junction_cache_usage_ratio",
    "junction_cache_blocks",
    "junction_request_ttft_seconds_bucket",
    "junction_request_e2e_seconds_bucket",
    "junction_requests_total",
    "junction_requests_finished_total",
    "junction_generation_tokens_total",
    "junction_requests_in_flight",
)


def samples(http) -> dict[tuple[str, tuple], float]:
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_models_lists_the_served_model(client):
    (model,) = client.models.list().data
    assert model.id == MODEL and model.object == "model" and model.owned_by == "junction"
    assert client.models.retrieve(MODEL).id == MODEL


def test_health(live_server):
    with live_server.http() as http:
        response = http.get("/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok" and response.json()["engine_id"] == "engine-test"


def test_metrics_count_hits_that_rise_after_a_repeated_prompt(client, live_server):
    hits = ("junction_prefix_cache_hits_tokens_total", (("group", "attention"),))
    queries = ("junction_prefix_cache_queries_tokens_total", (("group", "mamba"),))
    with live_server.http() as http:
        text = http.get("/metrics").text
        assert all(name in text for name in METRIC_NAMES)
        before = samples(http)
        prompt = text_prompt(301)
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=3)
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=3)
        after = samples(http)
    assert after[hits] > before[hits]
    assert after[queries] - before[queries] == 2 * 600
    assert (
        after[("junction_generation_tokens_total", ())]
        - before[("junction_generation_tokens_total", ())]
        == 6
    )
    assert after[("junction_requests_finished_total", (("reason", "length"),))] >= 2
    assert after[("junction_request_ttft_seconds_count", ())] >= 2
    blocks = after[("junction_cache_blocks", (("group", "attention"), ("state", "cached")))]
    assert blocks > 0
    assert 0 <= after[("junction_cache_usage_ratio", (("group", "mamba"),))] <= 1


def test_debug_blocks_is_the_snapshot_with_filters(client, live_server):
    client.completions.create(model=MODEL, prompt=text_prompt(302, 200), max_tokens=1)
    with live_server.http() as http:
        whole = http.get("/debug/blocks").json()
        mamba = http.get("/debug/blocks", params={"group": "mamba"}).json()
        free = http.get("/debug/blocks", params={"group": "attention", "state": "cached"}).json()
        bad_group = http.get("/debug/blocks", params={"group": "kv"})
        bad_state = http.get("/debug/blocks", params={"state": "hot"})
    assert set(whole) == {"engine_id", "step", "geometry", "groups", "blocks"}
    assert whole["engine_id"] == "engine-test"
    assert whole["groups"] == {
        "attention": {"block_size": 16, "num_blocks": 512},
        "mamba": {"block_size": 64, "num_blocks": 512},
    }
    assert len(whole["blocks"]) == 1024
    block = whole["blocks"][0]
    assert set(block) >= {"group", "block_id", "state", "keys", "token_range", "ref_cnt"}
    assert {b["group"] for b in mamba["blocks"]} == {"mamba"} and len(mamba["blocks"]) == 512
    assert all(b["group"] == "attention" and b["state"] == "cached" for b in free["blocks"])
    assert free["blocks"] and all(b["keys"] for b in free["blocks"])  # free, still cached
    assert (
        bad_group.status_code == 400
        and "choose one of attention, mamba" in (bad_group.json()["error"]["message"])
    )
    assert bad_state.status_code == 400 and bad_state.json()["error"]["param"] == "state"
