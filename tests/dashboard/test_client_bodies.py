"""Every read of the control plane's client (`client.rest`) against the live, seeded stack the
pages read: each answer decodes into its `client.types` struct (a body that does not fit
would be an `ApiError` naming the field), and holds what the API served as JSON."""

from __future__ import annotations

import msgspec

from client.rest import ApiClient
from client.types import EngineDetail, EngineOut, PinOut, RequestOut
from tests.api.processes import TOKEN
from tests.dashboard.conftest import REPLAY_ENGINE, Stack


def test_every_read_decodes_a_real_body(stack: Stack) -> None:
    api = ApiClient(stack.url, TOKEN)
    engines = api.engines()  # the replay's, and those other tests of the session added
    assert all(isinstance(e, EngineOut) for e in engines)
    assert REPLAY_ENGINE in [e.engine_id for e in engines]
    detail = api.engine(REPLAY_ENGINE)
    assert isinstance(detail, EngineDetail) and detail.cache["attention"].num_blocks == 320
    assert (
        msgspec.to_builtins(detail.geometry) == stack.get(f"/engines/{REPLAY_ENGINE}")["geometry"]
    )
    page = api.requests(REPLAY_ENGINE, limit=5)
    assert page.total >= len(stack.outputs) - 1 and len(page.requests) == 5  # less the pin line
    request = api.request(REPLAY_ENGINE, page.requests[0].request_id)
    assert isinstance(request, RequestOut) and request == page.requests[0]
    assert api.hit_rate(REPLAY_ENGINE).total.num_requests == page.total
    assert api.attribution(REPLAY_ENGINE).engine_id == REPLAY_ENGINE
    grid = api.block_grid(REPLAY_ENGINE, "attention", keys=True)
    assert grid.num_blocks == 320 and len(grid.block_id) == len(grid.state)
    assert api.peer_summary(REPLAY_ENGINE).kind == "junction"  # block ids: no peer cache
    assert api.peer_blocks(REPLAY_ENGINE).total == 0
    assert api.peer_tree(REPLAY_ENGINE).nodes == []
    assert api.peer_suggested_junctions(REPLAY_ENGINE).junctions == []
    pins = api.pins()
    assert pins and all(isinstance(p, PinOut) for p in pins)
    assert "engine" in [p.origin for p in pins]  # the trace's pin line
    assert api.suggested_junctions().junctions  # the seeded junction
    runs = api.benchmarks()
    assert stack.benchmark_id in [run.id for run in runs.runs]
    run = api.benchmark(stack.benchmark_id)
    assert run.status == "finished" and run.results is not None
    assert api.whatif_runs(REPLAY_ENGINE).total == len(api.whatif_runs(REPLAY_ENGINE).runs)


def test_a_body_reads_as_the_api_served_it(stack: Stack) -> None:
    """A struct written back as JSON is the API's own body: no field lost, none renamed."""
    api = ApiClient(stack.url, TOKEN)
    served = stack.get(f"/engines/{REPLAY_ENGINE}/requests", limit=3)
    decoded = msgspec.json.decode(msgspec.json.encode(api.requests(REPLAY_ENGINE, limit=3)))
    assert decoded == served
