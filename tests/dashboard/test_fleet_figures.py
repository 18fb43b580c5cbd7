"""The Fleet page's figure builders, from `GET /fleet` and `/fleet/decisions` bodies as the
router writes them."""

from __future__ import annotations

from client.types import Decision, FleetView
from dashboard.figures.decision_scores import (
    CHOSEN_COLOR,
    OTHER_COLOR,
    scores_figure,
    scores_frame,
)
from dashboard.figures.fleet import down_reasons, engines_frame, share_figure
from tests.dashboard.bodies import body


def engine(url: str, engine_id: str | None, **changes) -> dict:
    row = {
        "url": url,
        "engine_id": engine_id,
        "model": "junction-hybrid-tiny",
        "status": "up",
        "down_reason": None,
        "last_frame_age_s": 0.2,
        "num_keys": {"attention": 78, "mamba": 24},
        "load": {
            "num_running": 1,
            "num_waiting": 2,
            "num_prefill_tokens": 300,
            "usage": {"attention": 0.25, "mamba": 0.5},
        },
        "num_in_flight": 1,
        "num_routed": 3,
        "routed_share": 0.75,
        "num_prompt_tokens": 3000,
        "num_predicted_tokens": 2000,
        "num_realised_tokens": 1800,
        "hit_rate": 0.6,
        "num_failed": 0,
        "num_snapshots": 1,
    }
    return row | changes


def fleet() -> dict:
    down = engine(
        "http://b:8000",
        None,
        status="down",
        down_reason="cannot reach its cache feed",
        num_routed=1,
        routed_share=0.25,
        hit_rate=0.0,
        num_keys={"attention": 0, "mamba": 0},
    )
    engines = [engine("http://a:8000", "a"), down]
    return {"policy": "hybrid", "num_routed": 4, "agreement": 0.5, "engines": engines}


def score(url: str, engine_id: str, hit: int, attention: int, in_flight: int, load: int) -> dict:
    return {
        "url": url,
        "engine_id": engine_id,
        "hit": hit,
        "attention": attention,
        "in_flight": in_flight,
        "load": load,
        "score": max(hit, in_flight) - load,
    }


def decision() -> dict:
    scores = [
        score("http://a:8000", "a", 64, 512, 0, 128),
        score("http://b:8000", "b", 448, 448, 0, 300),
        score("http://c:8000", "c", 0, 0, 320, 0),
    ]
    return {"url": "http://c:8000", "engine_id": "c", "reason": "in_flight", "scores": scores}


def test_engines_frame_names_each_engine_and_why_one_is_down():
    frame = engines_frame(body(FleetView, fleet())).set_index("url")
    assert frame.loc["http://a:8000", "engine"] == "a"
    assert frame.loc["http://b:8000", "engine"] == "http://b:8000"  # no id yet: its URL
    assert frame.loc["http://a:8000", "status"] == "up"
    assert frame.loc["http://b:8000", "status"] == "down"
    assert frame.loc["http://b:8000", "why down"] == "cannot reach its cache feed"
    assert frame.loc["http://a:8000", "why down"] == ""
    assert frame.loc["http://a:8000", "queued prefill tokens"] == 300
    assert frame.loc["http://a:8000", "mamba usage"] == 0.5
    assert frame.loc["http://a:8000", "attention keys"] == 78
    assert list(frame["routed share"]) == [0.75, 0.25]


def test_share_figure_draws_each_engines_share_beside_its_hit_rate():
    fig = share_figure(engines_frame(body(FleetView, fleet())))
    bars = {trace.name: trace for trace in fig.data}
    assert set(bars) == {"routed share", "hit rate"}
    assert list(bars["routed share"].x) == ["a", "http://b:8000"]
    assert list(bars["routed share"].y) == [0.75, 0.25]
    assert list(bars["hit rate"].y) == [0.6, 0.0]
    assert fig.layout.barmode == "group"


def test_scores_frame_marks_the_chosen_engine_only():
    frame = scores_frame(body(Decision, decision()))
    assert list(frame["engine"]) == ["a", "b", "c"]
    assert list(frame["chosen"]) == [False, False, True]
    assert list(frame["score"]) == [-64, 148, 320]


def test_scores_figure_bars_are_the_scores_and_their_parts():
    frame = scores_frame(body(Decision, decision()))
    bars = {trace.name: trace for trace in scores_figure(frame, "in_flight").data}
    assert list(bars["score"].y) == [-64, 148, 320]
    assert list(bars["usable hybrid hit"].y) == [64, 448, 0]
    assert list(bars["attention match"].y) == [512, 448, 0]
    assert list(bars["hit in flight"].y) == [0, 0, 320]
    assert list(bars["load (subtracted)"].y) == [-128, -300, 0]  # below zero: taken off
    for trace in bars.values():
        assert list(trace.x) == ["a", "b", "c"]
        assert list(trace.customdata) == ["http://a:8000", "http://b:8000", "http://c:8000"]


def test_scores_figure_marks_the_chosen_engine_with_the_reason():
    fig = scores_figure(scores_frame(body(Decision, decision())), "in_flight")
    score_bar = next(trace for trace in fig.data if trace.name == "score")
    assert list(score_bar.marker.color) == [OTHER_COLOR, OTHER_COLOR, CHOSEN_COLOR]
    assert list(score_bar.marker.line.width) == [0, 0, 3]
    (note,) = fig.layout.annotations
    assert note.x == "c" and note.text == "chosen: in_flight"
    assert note.y == 320  # over the tallest of its bars


def test_scores_figure_marks_an_engine_chosen_without_a_score():
    """Round robin scores every engine 0: the chosen one is still marked."""
    plain = decision() | {"url": "http://a:8000", "reason": "round_robin"}
    plain["scores"] = [s | {"score": 0} for s in plain["scores"]]
    fig = scores_figure(scores_frame(body(Decision, plain)), "round_robin")
    score_bar = next(trace for trace in fig.data if trace.name == "score")
    assert list(score_bar.y) == [0, 0, 0]
    assert list(score_bar.marker.line.width) == [3, 0, 0]
    (note,) = fig.layout.annotations
    assert (note.x, note.text) == ("a", "chosen: round_robin")


def test_a_down_engines_reason_is_said_in_full_below_the_table():
    """Issue 47, item 17: after an `up` row the grid sized the status column to "up" and cut
    "down: cannot reach ..." to "down: c". The status is a word now, the reason a line."""
    reason = "cannot reach its cache feed: [Errno 111] Connection refused (retrying in 2 s)"
    view = fleet()
    view["engines"][1]["down_reason"] = reason
    frame = engines_frame(body(FleetView, view))
    assert set(frame["status"]) == {"up", "down"}
    assert down_reasons(body(FleetView, view)) == [
        f"**http://b:8000** (http://b:8000) is down: {reason}"
    ]
