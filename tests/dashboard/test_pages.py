"""An AppTest per page against the live API seeded by a real replay: each page renders with
no exception and shows the numbers REST gives for the seeded engine; the writes go only with
the write token a visitor entered in their session."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import pytest
from streamlit.testing.v1 import AppTest, AppTestError
from websockets.sync.client import connect

from dashboard.connection import WRITE_TOKEN
from dashboard.grid.arrows import MAX_ARROWS
from dashboard.pins.cards import NO_TOKEN_NO_TEXT
from engine.config import CacheConfig
from engine.engine import Engine
from engine.model.tokenizer import ByteTokenizer
from engine.wire import encode
from tests.api import factories
from tests.api.processes import AUTH, TOKEN
from tests.dashboard.big_table import seed_big_engine
from tests.dashboard.conftest import REPLAY_ENGINE, Stack

APP = Path(__file__).parents[2] / "dashboard" / "app.py"
BIG_ENGINE = "big-100k"


def open_page(page: str, write_token: str | None = None, **query: str) -> AppTest:
    """The page, for a visitor who entered `write_token` in the sidebar (None: none)."""
    at = AppTest.from_file(APP, default_timeout=60)
    if write_token is not None:
        at.session_state[WRITE_TOKEN] = write_token
    at.run()
    at.query_params.update(query)
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    parts = []
    for kind in ("markdown", "caption", "info", "warning", "error", "success", "subheader"):
        parts += [str(element.value) for element in at.get(kind)]
    return "\n".join(parts)


def figures(at: AppTest) -> list[dict]:
    """The charts' figures, Plotly's typed arrays (`{"dtype", "bdata"}`) decoded to lists."""
    return [decode(json.loads(chart.proto.spec)) for chart in at.get("plotly_chart")]


def decode(value):
    if isinstance(value, dict):
        if "bdata" in value and "dtype" in value:
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
            if "shape" in value:
                shape = [int(n) for n in str(value["shape"]).split(",")]
                array = array.reshape(shape)
            return (
                [None if isinstance(v, float) and np.isnan(v) else v for v in array.tolist()]
                if array.ndim == 1
                else [decode_row(row) for row in array.tolist()]
            )
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


def decode_row(row: list) -> list:
    return [None if isinstance(v, float) and np.isnan(v) else v for v in row]


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_overview_shows_the_replayed_engine(dashboard_env: Stack):
    total = dashboard_env.get(f"/engines/{REPLAY_ENGINE}/hit-rate")["total"]
    engine = dashboard_env.get(f"/engines/{REPLAY_ENGINE}")
    at = open_page("overview", engine=REPLAY_ENGINE)
    assert [s.value for s in at.subheader] == [f"{REPLAY_ENGINE} · disconnected"]
    assert f"epoch {engine['epoch']}" in texts(at)
    assert metric(at, "token hit rate") == f"{total['hit_rate']:.1%}"
    assert metric(at, "tokens saved") == f"{total['cached_tokens']:,}"
    assert metric(at, "requests") == f"{total['num_requests']:,}" == "12"
    names = {trace.get("name") for fig in figures(at) for trace in fig["data"]}
    assert {"overall", "attention", "mamba", "free", "cached", "in use", "pinned"} <= names
    usage = next(f for f in figures(at) if any(t.get("name") == "pinned" for t in f["data"]))
    pinned = next(t for t in usage["data"] if t["name"] == "pinned")
    by_group = dict(zip(pinned["y"], pinned["x"], strict=True))
    assert by_group["attention"] == engine["cache"]["attention"]["num_pinned"] == 35
    geometry = at.table[0].value
    assert geometry.loc["Mamba block (tokens)", "value"] == "64"
    assert geometry.loc["attention pool (blocks)", "value"] == "320"


def test_overview_says_when_an_engine_gave_up_finished_requests(dashboard_env: Stack):
    engine = Engine(CacheConfig(num_blocks=64), runner="ledger", engine_id="dropper")
    url = dashboard_env.url.replace("http://", "ws://") + "/api/v1/ingest"
    with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        ws.send(encode(factories.hello(engine)))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        why = "more than 1024 bytes of finished requests waited for the control plane"
        snapshot = factories.snapshot(engine, seq=0) | {
            "num_batches_dropped": 40,
            "num_requests_dropped": 7,
            "last_drop": f"dropped 7 finished requests: {why}",
        }
        ws.send(encode(snapshot))
        while (answer := json.loads(ws.recv(timeout=10)))["type"] == "command":
            pass  # the active pins other tests made, sent to every engine after its hello
        assert answer == {"type": "ack", "seq": 0}
    stored = dashboard_env.get("/engines/dropper")
    assert (stored["num_batches_dropped"], stored["num_requests_dropped"]) == (40, 7)
    at = open_page("overview", engine="dropper")
    warning = " ".join(str(w.value) for w in at.warning)
    assert "gave up 7 finished requests" in warning and why in warning
    assert "--outbox-bytes" in warning
    # the seeded engine lost nothing: no warning there
    assert not open_page("overview", engine=REPLAY_ENGINE).warning


CARD = {
    "name": "granite-4.0-h-tiny",
    "architecture": "GraniteMoeHybridForCausalLM",
    "source": "/models/granite-4.0-h-tiny",
    "dtype": "bfloat16",
}


def test_overview_and_the_engine_picker_name_the_engines_model(dashboard_env: Stack):
    """Issue 33 (5): the model an engine runs, as its hello's model card reports it."""
    engine = Engine(CacheConfig(num_blocks=64), runner="ledger", engine_id="carded")
    url = dashboard_env.url.replace("http://", "ws://") + "/api/v1/ingest"
    with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        ws.send(encode(factories.hello(engine) | {"model": CARD}))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
    assert dashboard_env.get("/engines/carded")["model"] == CARD
    at = open_page("overview", engine="carded")
    assert (
        "model **granite-4.0-h-tiny** · architecture `GraniteMoeHybridForCausalLM` · "
        "from `/models/granite-4.0-h-tiny`"
    ) in texts(at)
    replayed = dashboard_env.get(f"/engines/{REPLAY_ENGINE}")["model"]  # the replay's own card
    at = open_page("overview", engine=REPLAY_ENGINE)
    assert f"model **{replayed['name']}** · architecture `{replayed['architecture']}`" in texts(at)
    at = open_page("block_tables", engine="carded")
    assert "carded · granite-4.0-h-tiny (disconnected)" in at.selectbox(key="blocks_engine").options


def test_block_tables_outline_a_request_and_its_hit_boundary(dashboard_env: Stack):
    request = dashboard_env.get(f"/engines/{REPLAY_ENGINE}/requests/q1")
    at = open_page("block_tables", engine=REPLAY_ENGINE, request="q1")
    assert "Blocks 0-319 of 320 attention blocks, one cell each" in texts(at)
    assert f"hit **{request['num_cached_tokens']:,}**" in texts(at)
    (fig,) = figures(at)
    heatmap = fig["data"][0]
    cells = [v for row in heatmap["z"] for v in row if v is not None]
    assert len(cells) == 320
    assert cells.count(5) == 35  # the pinned system prompt's attention blocks
    outline = next(t for t in fig["data"] if t["name"] == "request's blocks")
    num_blocks = len([b for b in request["block_ids"]["attention"] if b is not None])
    assert outline["x"].count(None) == num_blocks  # one closed rectangle per block
    boundary = next(t for t in fig["data"] if t["name"].startswith("hit boundary"))
    assert boundary["name"] == "hit boundary (token 560)"
    summary = at.dataframe[0].value
    assert list(summary["hit (tokens)"]) == [560, 560]


def test_block_tables_draw_copies_in_the_mamba_group(dashboard_env: Stack):
    at = open_page("block_tables", engine=REPLAY_ENGINE, group="mamba")
    (fig,) = figures(at)
    copy = next(t for t in fig["data"] if t["name"] == "copy (src → dst)")
    # every Mamba copy the engine made: the requests' and the pin prefill's (its resend stop)
    events = dashboard_env.get("/events", engine_id=REPLAY_ENGINE, after_seq=-1, limit=1000)
    assert len(events["batches"]) <= 64  # the grid draws the links of the last 64 batches
    copies = [
        ev
        for batch in events["batches"]
        for ev in batch["events"]
        if ev["type"] == "BlockCopied" and ev["group"] == "mamba"
    ]
    lines = dashboard_env.outputs.values()
    by_requests = [c for line in lines for c in line.get("cow_copies", []) if c["group"] == "mamba"]
    assert len(copies) >= len(by_requests) > 0
    # one arrow for the copies between the same two cells, at most MAX_ARROWS of them
    pairs = {(c["src_block_id"], c["dst_block_id"]) for c in copies}
    assert copy["x"].count(None) == min(len(pairs), MAX_ARROWS)
    links = at.dataframe[0].value  # the copies and the moves
    assert (links["kind"] == "copy").sum() == len(copies)
    assert f"for {len(links)} recent copies and moves" in texts(at)
    assert "Recent copies and moves" in texts(at)


def test_block_tables_draw_only_the_found_requests_links(dashboard_env: Stack):
    """Issue 16: with a request found, only its own copies and moves are drawn; a Mamba table's
    held blocks show their ids, not a row of dots."""
    every = open_page("block_tables", engine=REPLAY_ENGINE, group="mamba").dataframe[0].value
    finished = {
        r["request_id"] for r in dashboard_env.get(f"/engines/{REPLAY_ENGINE}/requests")["requests"]
    }
    (request_id, *_) = [r for r in every["request_id"] if r in finished]
    request = dashboard_env.get(f"/engines/{REPLAY_ENGINE}/requests/{request_id}")
    at = open_page("block_tables", engine=REPLAY_ENGINE, group="mamba", request=request_id)
    summary = at.dataframe[0].value.set_index("group")
    mamba = request["block_ids"]["mamba"]
    held = [(i, b) for i, b in enumerate(mamba) if b is not None]
    assert held and None in mamba
    shown = summary.loc["mamba", "block ids"]
    assert "·" not in shown and all(f"#{i}: {b}" in shown for i, b in held)
    assert f"({mamba.count(None)} of {len(mamba)} slots hold no block)" in shown
    own = every[every["request_id"] == request_id]
    assert 0 < len(own) < len(every)
    assert f"for {len(own)} request {request_id}'s copies and moves" in texts(at)
    (fig,) = figures(at)
    drawn = [t for t in fig["data"] if t["name"].endswith("(src → dst)")]
    pairs = {(r.kind, r.src, r.dst) for r in own.itertuples()}
    assert sum(t["x"].count(None) for t in drawn) == len(pairs)


def test_block_tables_say_a_never_used_block_is_free(dashboard_env: Stack):
    at = open_page("block_tables", engine=REPLAY_ENGINE)
    (fig,) = figures(at)
    text = [t for row in fig["data"][0]["text"] for t in row]
    assert len(text) >= 320 and all(isinstance(t, str) for t in text[:320])
    assert "block 319 · free, never used" in text  # the replay never reached the last block


def test_block_tables_aggregate_100k_blocks_and_say_so(dashboard_env: Stack):
    ensure_big_engine(dashboard_env)
    at = open_page("block_tables", engine=BIG_ENGINE)
    warning = texts(at)
    assert "100,000 attention blocks" in warning and "each cell aggregates 10" in warning
    (fig,) = figures(at)
    heatmap = fig["data"][0]
    cells = [v for row in heatmap["z"] for v in row if v is not None]
    assert len(cells) == 10_000
    assert cells[:200] == [5] * 200  # the first 2,000 blocks are pinned
    text = [t for row in heatmap["text"] for t in row if t]
    assert text[0] == "blocks 0-9<br>10 pinned"


def ensure_big_engine(stack: Stack) -> None:
    if not any(e["engine_id"] == BIG_ENGINE for e in stack.get("/engines")):
        seed_big_engine(stack.database_url, BIG_ENGINE, 100_000)


def test_requests_list_and_chunk_timeline(dashboard_env: Stack):
    page = dashboard_env.get(f"/engines/{REPLAY_ENGINE}/requests")
    at = open_page("requests", engine=REPLAY_ENGINE)
    table = at.dataframe[0].value
    assert sorted(table["request"]) == sorted(r["request_id"] for r in page["requests"])
    assert "The 12 newest of 12 requests." in texts(at)
    at.selectbox(key="requests_one").select("q1").run()
    q1 = next(r for r in page["requests"] if r["request_id"] == "q1")
    assert f"hit {q1['num_cached_tokens']:,}, computed {q1['num_computed_tokens']:,}" in texts(at)
    fig = figures(at)[-1]  # the chunk timeline, after the requests' attribution
    reasons = {trace["name"] for trace in fig["data"]}
    assert reasons == {"cached (hit)", *q1["chunk_stop_reasons"]}
    assert fig["layout"]["xaxis"]["title"]["text"] == "prompt position (tokens)"


def test_checkpoints_pins_junctions_and_the_form(dashboard_env: Stack):
    (system,) = [p for p in dashboard_env.get("/pins") if p["label"] == "system"]
    junction = dashboard_env.get("/junctions/suggested")["junctions"][0]
    at = open_page("checkpoints", write_token=TOKEN)
    shown = texts(at)
    assert f"**{system['tokens_saved']:,} tokens saved**" in shown
    assert system["tokens_saved"] == 6 * 560
    # the replay's engine has stopped: its pin was materialized, and is held nowhere now
    assert dashboard_env.get(f"/engines/{REPLAY_ENGINE}")["connected"] is False
    assert f"{REPLAY_ENGINE}: **not held: engine stopped** at token 560" in shown
    assert "materialized" not in shown.replace("materializes", "")
    assert f"Boundary **{junction['boundary']:,}** tokens" in shown
    assert f"saved **{junction['tokens_saved']:,}** tokens" in shown

    at.text_area(key="pin_text").input("You are a helpful assistant. " * 4)
    at.radio(key="pin_as").set_value("pasted text")
    at.text_input(key="pin_label").input("apptest prompt")
    at.button[0].click().run()  # the form's submit button comes first
    assert not at.exception
    assert "Pin: done" in texts(at)
    (made,) = [p for p in dashboard_env.get("/pins") if p["label"] == "apptest prompt"]
    assert made["num_tokens"] == len("You are a helpful assistant. " * 4)
    at.button(key=f"unpin_{made['pin_id']}").click().run()
    assert "Unpin: done" in texts(at)
    assert dashboard_env.get(f"/pins/{made['pin_id']}")["state"] == "released"

    at.button(key=f"pin_junction_{junction['key']}").click().run()
    assert "Pin: done" in texts(at)
    (pinned,) = [
        p for p in dashboard_env.get("/pins") if p["label"] == f"junction@{junction['boundary']}"
    ]
    assert pinned["num_tokens"] == junction["boundary"] == 288
    at.button(key=f"unpin_{pinned['pin_id']}").click().run()
    assert dashboard_env.get(f"/pins/{pinned['pin_id']}")["state"] == "released"


def test_the_pin_form_pins_a_chat_system_prompt(dashboard_env: Stack):
    at = open_page("checkpoints", write_token=TOKEN)
    system = "You are a terse assistant. " * 5
    at.text_area(key="pin_text").input(system)
    at.radio(key="pin_as").set_value("system prompt (chat)")
    at.text_input(key="pin_label").input("apptest chat prompt")
    at.button[0].click().run()
    assert not at.exception and "Pin: done" in texts(at)
    (made,) = [p for p in dashboard_env.get("/pins") if p["label"] == "apptest chat prompt"]
    assert made["num_tokens"] == len(f"<|system|>\n{system}\n")  # as the chat template renders
    at.button(key=f"unpin_{made['pin_id']}").click().run()
    assert dashboard_env.get(f"/pins/{made['pin_id']}")["state"] == "released"


def test_the_pin_form_defaults_to_a_chat_system_prompt_and_says_what_each_form_matches(
    dashboard_env: Stack,
):
    """Issue 33 (1): a system prompt pasted into the form with its defaults is pinned as chat
    messages (what chat requests with that system prompt hit), and the help says that pasted
    text matches completions, not chats."""
    at = open_page("checkpoints", write_token=TOKEN)
    choice = at.radio(key="pin_as")
    assert choice.value == "system prompt (chat)" == choice.options[0]
    assert "/v1/chat/completions" in choice.help
    assert "matches completions (`/v1/completions`)" in choice.help and "not chats" in choice.help
    system = "You are a careful assistant. " * 5
    at.text_area(key="pin_text").input(system)
    at.text_input(key="pin_label").input("apptest default form")
    at.button[0].click().run()  # nothing but the text and the label entered
    assert not at.exception and "Pin: done" in texts(at)
    (made,) = [p for p in dashboard_env.get("/pins") if p["label"] == "apptest default form"]
    try:
        stored = dashboard_env.get(f"/pins/{made['pin_id']}")
        assert stored["source"] == {"messages": [{"role": "system", "content": system}]}
        assert made["num_tokens"] == len(f"<|system|>\n{system}\n")
    finally:
        at.button(key=f"unpin_{made['pin_id']}").click().run()
    assert dashboard_env.get(f"/pins/{made['pin_id']}")["state"] == "released"


def test_benchmarks_show_a_finished_run(dashboard_env: Stack):
    run = dashboard_env.get(f"/benchmarks/{dashboard_env.benchmark_id}")
    at = open_page("benchmarks")
    assert not at.error
    hit_rate, ttft = figures(at)
    bars = next(t for t in hit_rate["data"] if t["name"] == "hit rate")
    modes = {m["mode"]: m for m in run["results"]["modes"]}
    assert dict(zip(bars["x"], bars["y"], strict=True)) == {
        mode: m["hit_rate"] for mode, m in modes.items()
    }
    oracle = next(t for t in hit_rate["data"] if t["name"] == "oracle")
    assert oracle["y"][0] == modes["off"]["oracle_hit_rate"]
    median = next(t for t in ttft["data"] if t["name"] == "median")
    assert median["y"][0] == pytest.approx(modes[median["x"][0]]["ttft_median_s"] * 1000)
    assert ttft["layout"]["yaxis"]["title"]["text"] == "TTFT (ms)"


def test_benchmark_form_enqueues_a_run(dashboard_env: Stack):
    """Issue 33 (2): the form's defaults queue the quick preset, and the confirmation names the
    run's id and stays up across the live refreshes."""
    before = dashboard_env.get("/benchmarks")["total"]
    at = open_page("benchmarks", write_token=TOKEN)
    at.button(key="bench_enqueue").click().run()  # the defaults, as a first visitor leaves them
    runs = dashboard_env.get("/benchmarks")
    assert runs["total"] == before + 1
    run = runs["runs"][0]
    assert run["status"] == "queued" and run["name"] == "quick-shared-prefix"
    assert (
        run["spec"]["workload"]["num_groups"] * run["spec"]["workload"]["prompts_per_group"] == 64
    )
    (success,) = at.success
    assert f"Run **#{run['id']}** (quick-shared-prefix, 384 requests) queued" in success.value
    at.run()  # a live refresh keeps it up
    assert [s.value for s in at.success] == [success.value]


def test_benchmark_form_estimates_the_run_before_it_is_queued(dashboard_env: Stack):
    """Issue 33 (2): the default preset is small and says what it runs; the form counts any
    spec's requests x modes before Enqueue, and warns of a long one."""
    at = open_page("benchmarks", write_token=TOKEN)
    assert at.selectbox(key="bench_preset").value == "quick"
    assert "64 requests × 6 modes" in texts(at) and "2.4 s with `junction bench`" in texts(at)
    (info,) = [i.value for i in at.info if "This run replays" in i.value]
    assert info == (
        "This run replays 64 requests (69,632 prompt tokens) × 6 modes = **384 requests** on "
        "the ledger runner."
    )
    at.multiselect(key="bench_modes_quick").set_value(["off", "junction_inline"]).run()
    assert "× 2 modes = **128 requests**" in texts(at)
    workload = json.loads(at.text_area(key="bench_workload_quick").value)
    big = {**workload, "num_groups": 64, "prompts_per_group": 16}
    at.text_area(key="bench_workload_quick").input(json.dumps(big)).run()
    assert "1,024 requests" in texts(at) and "= **2,048 requests**" in texts(at)
    assert any("can take many minutes" in w.value for w in at.warning)
    at.text_area(key="bench_workload_quick").input('{"kind": "no-such-kind"}').run()
    assert any("No estimate" in w.value for w in at.warning)


def test_benchmarks_page_says_junction_bench_runs_are_not_recorded(dashboard_env: Stack):
    """Issue 33 (11): the page lists only runs queued through the form or the REST API."""
    shown = texts(open_page("benchmarks"))
    assert "A `junction bench` on the command line" in shown
    assert "is not recorded here" in shown and "`POST` it to `/api/v1/benchmarks`" in shown
    assert "or `junction bench`;" not in shown


def test_unreachable_api_names_the_url(monkeypatch: pytest.MonkeyPatch):
    from tests.api.processes import free_port

    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("JUNCTION_CONTROL_PLANE_URL", url)
    monkeypatch.setenv("JUNCTION_API_TOKEN", TOKEN)
    pages = ("overview", "block_tables", "requests", "checkpoints", "benchmarks", "peer_cache")
    for page in (*pages, "whatif"):
        at = open_page(page)
        assert at.error, page
        assert f"{url}/api/v1/" in at.error[0].value
        assert "Cannot reach the control plane" in at.error[0].value


def test_empty_store_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tests.api.processes import ApiProcess, free_port

    api = ApiProcess(f"sqlite:///{tmp_path / 'empty.db'}", free_port())
    api.start()
    try:
        monkeypatch.setenv("JUNCTION_CONTROL_PLANE_URL", api.url)
        monkeypatch.setenv("JUNCTION_API_TOKEN", TOKEN)
        for page, hint in {
            "overview": "No engine has connected",
            "block_tables": "junction serve --control-plane",
            "requests": "junction replay",
            "checkpoints": "No pin yet",
            "benchmarks": "No benchmark run yet",
            "peer_cache": "No vLLM or SGLang engine is attached",
            "whatif": "No engine has connected",
        }.items():
            assert hint in texts(open_page(page)), page
    finally:
        api.kill()


def test_without_a_write_token_the_checkpoints_writes_are_disabled(dashboard_env: Stack):
    """An anonymous visitor: the dashboard reads with its own token, but the pin form, unpin
    and pin-it buttons wait for the write token, and nothing is written."""
    made = dashboard_env.post("/pins", {"prefix": {"text": "x" * 64}, "label": "by REST"})
    try:
        pins = dashboard_env.get("/pins")
        at = open_page("checkpoints")
    finally:
        gone = httpx.delete(f"{dashboard_env.url}/api/v1/pins/{made['pin_id']}", headers=AUTH)
        assert gone.is_success, gone.text
        pins = dashboard_env.get("/pins")
    assert "Enter the write token (the control plane's `JUNCTION_API_TOKEN`)" in texts(at)
    assert at.sidebar.text_input(key="write_token_field").value == ""
    submit = at.button[0]  # the form's
    assert submit.label == "Pin" and submit.disabled
    (unpin,) = [b for b in at.button if b.key == f"unpin_{made['pin_id']}"]
    pin_its = [b for b in at.button if (b.key or "").startswith("pin_junction_")]
    assert pin_its and all(button.disabled for button in [unpin, *pin_its])
    at.text_area(key="pin_text").input("You are an anonymous visitor. " * 4)
    with pytest.raises(AppTestError, match="disabled"):
        submit.click()
    at.run()
    assert not at.exception
    assert dashboard_env.get("/pins") == pins  # nothing was sent


def test_a_write_token_entered_in_the_sidebar_enables_the_writes(dashboard_env: Stack):
    at = open_page("checkpoints")
    at.sidebar.text_input(key="write_token_field").input(TOKEN).run()
    assert not at.button[0].disabled
    at.switch_page("views/overview.py").run()  # kept for the session, across pages
    at.switch_page("views/benchmarks.py").run()
    assert not at.exception
    assert at.sidebar.text_input(key="write_token_field").value == TOKEN
    assert "Enter the write token" not in texts(at)


def test_without_a_write_token_the_benchmark_form_is_disabled(dashboard_env: Stack):
    at = open_page("benchmarks")
    assert "Enter the write token" in texts(at)
    assert at.button[0].label == "Enqueue" and at.button[0].disabled


def test_without_any_token_the_dashboard_says_which_to_set(
    dashboard_env: Stack, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("JUNCTION_API_TOKEN")
    for page in ("overview", "checkpoints"):
        at = open_page(page)
        (error,) = at.error
        assert "has no token to read the control plane" in error.value
        assert "`JUNCTION_READ_TOKEN`" in error.value and "`JUNCTION_API_TOKEN`" in error.value


def test_the_dashboard_reads_with_the_read_token_first(
    dashboard_env: Stack, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("JUNCTION_READ_TOKEN", "not-a-token-the-api-has")
    at = open_page("overview")
    assert at.error and "HTTP 401: wrong bearer token" in at.error[0].value


def test_overview_explains_usage_and_the_epoch(dashboard_env: Stack):
    """Issue 16: the epoch reads as the engine's start (the raw value beside it), and usage
    says what it counts beside the cached blocks."""
    engine = dashboard_env.get(f"/engines/{REPLAY_ENGINE}")
    at = open_page("overview", engine=REPLAY_ENGINE)
    started = datetime.fromtimestamp(engine["epoch"] / 1e9, tz=UTC)
    assert f"engine started {started:%Y-%m-%d %H:%M:%S} UTC (epoch {engine['epoch']}" in texts(at)
    attention = engine["cache"]["attention"]
    held = attention["num_in_use"] + attention["num_pinned"]
    assert "Usage = blocks in use or pinned / all blocks" in texts(at)
    assert f"attention {held / attention['num_blocks']:.1%} ({held} of 320)" in texts(at)
    assert f"attention {attention['num_cached']}" in texts(at)


def test_requests_show_arrival_and_plain_wording(dashboard_env: Stack):
    page = dashboard_env.get(f"/engines/{REPLAY_ENGINE}/requests")
    at = open_page("requests", engine=REPLAY_ENGINE)
    table = at.dataframe[0].value.set_index("request")
    for request in page["requests"]:
        when = datetime.fromtimestamp(request["arrival_ts"], tz=UTC)
        assert table.loc[request["request_id"], "arrived (UTC)"].startswith(
            f"{when:%Y-%m-%d %H:%M:%S}"
        )
    at.selectbox(key="requests_one").select("q1").run()
    q1 = next(r for r in page["requests"] if r["request_id"] == "q1")
    assert len(q1["chunks"]) == 1 and len(q1["checkpoints"]) > 1
    shown = texts(at)
    assert "in 1 chunk;" in shown and "1 chunks" not in shown
    assert f"checkpoints at {', '.join(f'{c:,}' for c in q1['checkpoints'])}; arrived " in shown
    bare = [r for r in page["requests"] if not r["checkpoints"]]
    if bare:
        at.selectbox(key="requests_one").select(bare[0]["request_id"]).run()
        assert "; no checkpoint;" in texts(at) and "at none" not in texts(at)


def test_checkpoints_preview_junctions_and_explain_fell_short(dashboard_env: Stack):
    junctions = dashboard_env.get("/junctions/suggested")["junctions"]
    anonymous = open_page("checkpoints")  # no token typed in: no prompt text at all
    assert not anonymous.code and NO_TOKEN_NO_TEXT in texts(anonymous)
    at = open_page("checkpoints", write_token=TOKEN)
    text = ByteTokenizer().decode(junctions[0]["pin_request"]["prefix"]["token_ids"])
    previews = [c.value for c in at.code]
    assert len(previews) == len(junctions)
    assert previews[0] == ("…" if len(text) > 80 else "") + text[-80:]
    assert "Mamba hit fell short of it (no Mamba checkpoint there)" in texts(at)


def test_the_pin_form_targets_engines_with_a_priority_and_says_its_pin(dashboard_env: Stack):
    at = open_page("checkpoints", write_token=TOKEN)
    at.text_area(key="pin_text").input("You are a targeted assistant. " * 4)
    at.text_input(key="pin_label").input("apptest targeted")
    at.multiselect(key="pin_engines").select(REPLAY_ENGINE)
    at.number_input(key="pin_priority").set_value(7)
    at.button[0].click().run()
    assert not at.exception
    (made,) = [p for p in dashboard_env.get("/pins") if p["label"] == "apptest targeted"]
    try:
        assert made["priority"] == 7 and made["targets"] == [REPLAY_ENGINE]
        (success,) = at.success
        assert "Pin: done" in success.value and f"pin id `{made['pin_id']}`" in success.value
        at.run()  # a live refresh keeps the outcome up
        assert [s.value for s in at.success] == [success.value]
    finally:
        at.button(key=f"unpin_{made['pin_id']}").click().run()
    assert dashboard_env.get(f"/pins/{made['pin_id']}")["state"] == "released"


def test_benchmarks_table_reads_in_percent_with_human_headers(dashboard_env: Stack):
    run = dashboard_env.get(f"/benchmarks/{dashboard_env.benchmark_id}")
    at = open_page("benchmarks")
    table = at.dataframe[-1].value.set_index("mode")
    assert "hit rate (%)" in table and "hit_rate" not in table
    assert not [c for c in table.columns if "_" in c]
    for mode in run["results"]["modes"]:
        row = table.loc[mode["mode"]]
        assert row["hit rate (%)"] == round(mode["hit_rate"] * 100, 1)
        assert row["throughput (tokens/s)"] == round(mode["throughput_tok_s"])


def test_the_benchmark_presets_are_the_apis_suite(dashboard_env: Stack):
    suite = dashboard_env.get("/benchmarks/suite")
    at = open_page("benchmarks", write_token=TOKEN)
    assert at.selectbox(key="bench_preset").options == ["quick", *(s["name"] for s in suite)]
    at.selectbox(key="bench_preset").select(suite[0]["name"]).run()
    workload = json.loads(at.text_area[0].value)
    assert workload == {k: v for k, v in suite[0]["workload"].items() if v is not None}


def test_the_benchmark_form_takes_the_presets_runner(
    dashboard_env: Stack, monkeypatch: pytest.MonkeyPatch
):
    from client.rest import ApiClient

    suite = ApiClient.benchmark_suite  # the API's suite, and one more preset on another runner

    def with_a_null_preset(api: ApiClient) -> list[dict]:
        specs = suite(api)
        return [*specs, {**specs[0], "name": "null-preset", "runner": "null"}]

    monkeypatch.setattr(ApiClient, "benchmark_suite", with_a_null_preset)
    at = open_page("benchmarks", write_token=TOKEN)
    assert at.selectbox(key="bench_runner_quick").value == "ledger"
    at.selectbox(key="bench_preset").select("null-preset").run()
    assert at.selectbox(key="bench_runner_null-preset").value == "null"
