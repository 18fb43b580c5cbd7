"""The What-if page against the live API seeded by a real replay (an AppTest): a done run's
agreement line, curve and ranked table match its report; the form queues a run only with the
write token a visitor entered."""

from __future__ import annotations

from tests.api.processes import TOKEN
from tests.dashboard.conftest import REPLAY_ENGINE, Stack
from tests.dashboard.test_pages import figures, open_page, texts
from tests.dashboard.whatif_run import CHOICES, ensure_whatif


def test_a_done_run_shows_its_curve_table_and_agreement(dashboard_env: Stack):
    run = ensure_whatif(dashboard_env)
    report = run["result"]
    at = open_page("whatif", engine=REPLAY_ENGINE, run=str(run["id"]))
    assert not at.error, [e.value for e in at.error]
    shown = texts(at)
    assert (
        f"Replaying its own settings reproduces {report['agreement']:,} of "
        f"{report['num_requests']:,} requests' hits"
    ) in shown
    (curve,) = figures(at)
    lines = {t["name"]: t for t in curve["data"] if t["mode"] == "lines+markers"}
    assert set(lines) == {"as ran", "eviction lru"}
    by_label = {r["label"]: r for r in report["results"]}
    assert lines["as ran"]["y"] == [
        by_label["memory ×0.5"]["hit_rate"],
        report["as_ran"]["hit_rate"],
        by_label["memory ×2"]["hit_rate"],
    ]
    tables = [df.value for df in at.dataframe]
    ranked = next(t for t in tables if "gain vs as ran" in t.columns)
    gains = list(ranked["gain vs as ran"])
    assert gains == sorted(gains, reverse=True) and len(ranked) == len(report["results"]) + 1
    assert "as vLLM would" in list(ranked["setting"])


def test_the_form_starts_a_run_only_with_the_write_token(dashboard_env: Stack):
    path = f"/engines/{REPLAY_ENGINE}/whatif"
    before = dashboard_env.get(path)["total"]
    at = open_page("whatif", engine=REPLAY_ENGINE)
    assert at.button(key="wi_start").disabled
    assert "Enter the write token" in texts(at)
    at = open_page("whatif", write_token=TOKEN, engine=REPLAY_ENGINE)
    assert at.multiselect(key="wi_evictions").value == list(CHOICES.evictions)
    assert "6 settings, each replayed beside the engine's own." in texts(at)
    at.button(key="wi_start").click().run()
    page = dashboard_env.get(path)
    assert page["total"] == before + 1
    run = page["runs"][0]
    assert run["status"] == "queued" and len(run["settings"]) == 6
    (success,) = at.success
    assert f"What-if **#{run['id']}** queued (6 settings" in success.value
    at.text_area(key="wi_extra").input("[1]").run()
    assert any("not a setting or a list of them" in w.value for w in at.warning)
