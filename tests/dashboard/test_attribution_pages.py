"""Miss attribution on the Overview and Requests pages, against the live API: a ledger engine
with junction checkpoints off replays the known cases (a family parting inside a Mamba block,
an exact resend, a burst of one family, a flood that evicts a shared prefix), and the pages
show what REST says about them, with each reason's remedy."""

from __future__ import annotations

import json
from pathlib import Path

from websockets.sync.client import connect

from dashboard.figures.reasons import REASONS
from dashboard.figures.remedies import CHECKPOINTS_LINK
from dashboard.figures.request_attribution import missed_text
from engine.config import CacheConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.wire import encode
from tests.api import factories
from tests.api.processes import TOKEN
from tests.dashboard.conftest import Stack, replay, segments
from tests.dashboard.test_pages import figures, metric, open_page, texts

ATTRIBUTION_ENGINE = "attrib-0"
#: Small pools, so the flood evicts; no junction checkpoints and no interval states, so a
#: family that parts inside a Mamba block finds no state at its match.
OPTIONS = (
    "--no-junction-checkpoints",
    "--checkpoint-interval",
    "0",
    "--num-blocks",
    "64",
    "--num-mamba-blocks",
    "32",
    "--concurrency",
    "4",
)


def barrier(seed: int) -> dict:
    """A pin line of an unrelated 16-token prefix: the replay waits for every request before
    it, so what follows arrives after they finished."""
    return {"pin": segments((seed, 16)), "id": f"barrier-{seed}"}


def attribution_trace() -> list[dict]:
    parted = [segments((5, 100), (50 + i, 60)) for i in range(2)]
    lines: list[dict] = [{"id": "n1", "prompt": parted[0]}, barrier(91)]
    lines += [{"id": "n2", "prompt": parted[1]}, barrier(92), {"id": "n3", "prompt": parted[1]}]
    lines.append(barrier(93))  # n3 resends n2 exactly
    lines += [{"id": f"b{i + 1}", "prompt": segments((6, 256), (60 + i, 32))} for i in range(4)]
    lines += [barrier(94), {"id": "e1", "prompt": segments((7, 320), (70, 32))}, barrier(95)]
    lines += [{"id": f"flood{i + 1}", "prompt": segments((80 + i, 200))} for i in range(8)]
    lines += [barrier(96), {"id": "e2", "prompt": segments((7, 320), (71, 32))}]
    for line in lines:
        if "prompt" in line:
            line["max_tokens"] = 4
    return lines


def ensure_attribution_engine(stack: Stack, root: Path) -> None:
    """Replay `attribution_trace()` as `ATTRIBUTION_ENGINE`, once per stack."""
    if any(e["engine_id"] == ATTRIBUTION_ENGINE for e in stack.get("/engines")):
        return
    trace = root / "attribution.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in attribution_trace()))
    replay(stack.url, trace, root / "attribution-out.jsonl", ATTRIBUTION_ENGINE, OPTIONS)


def attributed(stack: Stack) -> dict[str, dict]:
    page = stack.get(f"/engines/{ATTRIBUTION_ENGINE}/requests", limit=1000)
    return {r["request_id"]: r for r in page["requests"] if r["request_id"][0] in "nbef"}


def test_the_known_cases_are_attributed_by_rest(dashboard_env: Stack, tmp_path: Path):
    """The REST the pages read: every request attributed, hit + missed = shared, and each
    known case misses for its reason."""
    ensure_attribution_engine(dashboard_env, tmp_path)
    requests = attributed(dashboard_env)
    assert all(r["attribution"]["state"] == "attributed" for r in requests.values())
    for request in requests.values():
        attribution = request["attribution"]
        assert request["num_cached_tokens"] + sum(attribution["missed_tokens"].values()) == max(
            attribution["shared_tokens"], request["num_cached_tokens"]
        )
    assert requests["n2"]["attribution"]["missed_tokens"]["no_state"] > 0
    assert requests["n3"]["attribution"]["missed_tokens"]["held_back"] > 0
    assert sum(requests[f"b{i}"]["attribution"]["missed_tokens"]["in_flight"] for i in (2, 3, 4))
    assert requests["e2"]["attribution"]["missed_tokens"]["evicted"] > 0


def test_overview_stacks_hit_and_missed_by_reason_against_the_oracle(
    dashboard_env: Stack, tmp_path: Path
):
    ensure_attribution_engine(dashboard_env, tmp_path)
    attribution = dashboard_env.get(f"/engines/{ATTRIBUTION_ENGINE}/attribution")
    total = attribution["total"]
    at = open_page("overview", engine=ATTRIBUTION_ENGINE)
    shared = total["shared_tokens"]
    assert metric(at, "truly shared") == f"{shared / total['prompt_tokens']:.1%}"
    assert metric(at, "of it hit") == f"{total['hit_tokens'] / shared:.1%}"
    assert metric(at, "of it missed (tokens)") == f"{sum(total['missed_tokens'].values()):,}"
    (chart,) = [f for f in figures(at) if any(t.get("stackgroup") for t in f["data"])]
    by_name = {t["name"].split(":")[0]: t for t in chart["data"]}
    # each bucket drawn as two points (its start and end): the sums are twice REST's
    assert sum(by_name["hit"]["y"]) == 2 * total["hit_tokens"]
    assert sum(by_name["shared (oracle)"]["y"]) == 2 * shared
    for reason, series in REASONS.items():
        assert sum(by_name[series.label]["y"]) == 2 * total["missed_tokens"][reason]


def test_overview_shows_each_reasons_remedy_with_what_it_would_have_saved(
    dashboard_env: Stack, tmp_path: Path
):
    ensure_attribution_engine(dashboard_env, tmp_path)
    total = dashboard_env.get(f"/engines/{ATTRIBUTION_ENGINE}/attribution")["total"]
    at = open_page("overview", engine=ATTRIBUTION_ENGINE)
    shown = texts(at)
    missed = {r: n for r, n in total["missed_tokens"].items() if n}
    assert {"no_state", "held_back", "in_flight", "evicted"} <= set(missed)
    for reason, tokens in missed.items():
        share = tokens / total["prompt_tokens"]
        assert (
            f"**{REASONS[reason].label}** ({REASONS[reason].short}): the remedy would have "
            f"saved **{tokens:,} tokens**, {share:.1%} of the window's prompt tokens"
        ) in shown
    assert "**Pin these boundaries**" in shown
    assert "**Turn on junction checkpoints** (`junction serve --junction-checkpoints`" in shown
    assert "**Enlarge the attention pool** (`--num-blocks`): 64 blocks of 16 tokens" in shown
    assert "**Enlarge the mamba pool** (`--num-mamba-blocks`): 32 blocks" in shown
    assert "an exact resend recomputes its last match unit (16 tokens)" in shown
    links = [link for link in at.get("page_link") if link.proto.label == CHECKPOINTS_LINK]
    assert links


def test_requests_show_each_requests_reasons_and_its_remedy(dashboard_env: Stack, tmp_path: Path):
    ensure_attribution_engine(dashboard_env, tmp_path)
    requests = attributed(dashboard_env)
    at = open_page("requests", engine=ATTRIBUTION_ENGINE)
    table = at.dataframe[0].value.set_index("request")
    for request_id, request in requests.items():
        attribution = request["attribution"]
        row = table.loc[request_id]
        assert row["shared"] == attribution["shared_tokens"]
        assert row["missed"] == sum(attribution["missed_tokens"].values())
        assert row["missed because"] == missed_text(attribution["missed_tokens"])
    assert table.loc["n2", "hit stopped"] == "no state"
    (shared,) = [t for f in figures(at) for t in f["data"] if t["name"] == "shared (oracle)"]
    assert set(requests) <= set(shared["y"])

    n2 = requests["n2"]
    at.selectbox(key="requests_one").select("n2").run()
    shown = texts(at)
    missed = n2["attribution"]["missed_tokens"]
    assert (
        f"Shared **{n2['attribution']['shared_tokens']:,}** tokens with earlier requests or "
        f"pins; hit **{n2['num_cached_tokens']:,}**, missed **{sum(missed.values()):,}**"
    ) in shown
    assert "The hit stopped because no Mamba state was kept at the attention match." in shown
    boundary = n2["hit_tokens_by_group"]["attention"]
    assert f"**Pin this boundary (token {boundary:,})**" in shown
    (junction,) = [
        j
        for j in dashboard_env.get("/junctions/suggested")["junctions"]
        if j["key"] == n2["attention_match_key"]
    ]
    num = junction["num_requests"]
    assert (
        f"the Checkpoints page suggests this one ({num} {'request' if num == 1 else 'requests'} "
        f"matched it; a pin would have saved them {junction['tokens_saved']:,} tokens)"
    ) in shown
    share = missed["no_state"] / n2["num_prompt_tokens"]
    assert f"saved **{missed['no_state']:,} tokens**, {share:.1%} of this request's" in shown


def stream_until_quick_finishes(stack: Stack, engine_id: str) -> None:
    """A ledger engine where `quick` arrives after `slow` and finishes first; what it emitted
    until then goes to the control plane over the ingest socket, as `junction serve` would."""
    engine = Engine(CacheConfig(num_blocks=64), runner="ledger", engine_id=engine_id)
    engine.add_request(list(range(200)), SamplingParams(max_tokens=200), request_id="slow")
    engine.add_request([7] * 48, SamplingParams(max_tokens=1), request_id="quick")
    while not any(r.request_id == "quick" for r in engine.step()):
        pass
    url = stack.url.replace("http://", "ws://") + "/api/v1/ingest"
    with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        ws.send(encode(factories.hello(engine)))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        frames = factories.batches(engine, factories.event_dicts(engine))
        for frame in frames:
            ws.send(encode(frame))
        acked = -1
        while acked < frames[-1]["seq"]:
            answer = json.loads(ws.recv(timeout=10))
            if answer["type"] == "ack":  # else the active pins' commands, sent after a hello
                acked = answer["seq"]


def test_a_request_waiting_for_an_earlier_arrival_reads_as_pending(dashboard_env: Stack):
    stream_until_quick_finishes(dashboard_env, "pending-0")
    (quick,) = dashboard_env.get("/engines/pending-0/requests")["requests"]
    assert quick["attribution"]["state"] == "pending"  # `slow` arrived first and still runs
    at = open_page("requests", engine="pending-0")
    row = at.dataframe[0].value.set_index("request").loc["quick"]
    assert row["missed because"] == "pending"
    assert row.isna()[["shared", "missed", "hit stopped"]].all()  # blank, never a zero
    assert "Miss attribution **pending**" in texts(at)
    assert not [f for f in figures(at) if any(t["name"] == "shared (oracle)" for t in f["data"])]
    overview = open_page("overview", engine="pending-0")
    assert "1 finished request waits for its attribution" in texts(overview)


def test_overview_says_what_each_reason_means_and_takes_a_window(
    dashboard_env: Stack, tmp_path: Path
):
    ensure_attribution_engine(dashboard_env, tmp_path)
    at = open_page("overview", engine=ATTRIBUTION_ENGINE)
    (meanings,) = [t.value for t in at.table if t.value.index.name == "series"]
    for series in REASONS.values():
        assert meanings.loc[series.label, "meaning"] == series.meaning
    before = metric(at, "of it missed (tokens)")
    at.sidebar.selectbox(key="overview_window").select("last 24 hours").run()
    assert not at.exception
    assert "**Why shared tokens missed** (last 24 hours)" in texts(at)
    assert metric(at, "of it missed (tokens)") == before  # the replay ran moments ago
