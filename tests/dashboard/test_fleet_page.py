"""The Fleet page against a real `junction route` over two real `junction serve --runner null`
engines: what it shows matches the router's `GET /fleet` and `/fleet/decisions`; without a
router URL it says how to start one, and a router that does not answer is named."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.processes import free_port
from tests.dashboard.conftest import chromium_or_skip
from tests.dashboard.test_pages import figures, open_page, texts
from tests.polling import wait_for
from tests.router.processes import AUTH, TOKEN, Process, running, start_engine, start_router

ENGINE_IDS = ("a", "b")
SYSTEM = "You are the fleet's patient assistant; answer in one short sentence. " * 12


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """Two engines (`a`, `b`) and a router in front of them, killed after the module."""
    logs = tmp_path_factory.mktemp("fleet")
    geometry = ("--num-blocks", "256", "--num-mamba-blocks", "32")
    started = [start_engine(logs, engine_id, *geometry) for engine_id in ENGINE_IDS]
    with running(*started) as engines, running(start_router(logs, engines)) as (router,):
        yield router


@pytest.fixture
def fleet_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The dashboard's settings, the control plane nowhere (the Overview it opens on just says
    so): each test says where the router is."""
    monkeypatch.setenv("JUNCTION_CONTROL_PLANE_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("JUNCTION_API_TOKEN", TOKEN)
    monkeypatch.delenv("JUNCTION_READ_TOKEN", raising=False)
    monkeypatch.delenv("JUNCTION_ROUTER_URL", raising=False)
    monkeypatch.setenv("JUNCTION_DASHBOARD_REFRESH_S", "3600")
    return monkeypatch


def chat(router: Process, question: str, system: str = SYSTEM) -> httpx.Response:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = {"model": "junction-hybrid-tiny", "messages": messages, "max_tokens": 4}
    response = httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response


def get(router: Process, path: str) -> dict:
    response = httpx.get(f"{router.url}{path}", headers=AUTH, timeout=10)
    response.raise_for_status()
    return response.json()


def keys(router: Process) -> int:
    return sum(e["num_keys"]["attention"] for e in get(router, "/fleet")["engines"])


def test_without_a_router_url_the_page_says_how_to_start_one(fleet_env):
    at = open_page("fleet")
    (hint,) = at.info
    assert "junction route" in hint.value
    assert "--router-url" in hint.value and "JUNCTION_ROUTER_URL" in hint.value
    assert not at.error and not at.dataframe


def test_a_router_that_does_not_answer_is_named(fleet_env):
    url = f"http://127.0.0.1:{free_port()}"
    fleet_env.setenv("JUNCTION_ROUTER_URL", url)
    at = open_page("fleet")
    (error,) = at.error
    assert f"Cannot reach the router at {url}/fleet" in error.value
    assert not at.dataframe and not at.get("plotly_chart")


def test_a_wrong_token_says_whose_token_to_set(fleet_env, router: Process):
    fleet_env.setenv("JUNCTION_ROUTER_URL", router.url)
    fleet_env.setenv("JUNCTION_API_TOKEN", "not-the-routers")
    (error,) = open_page("fleet").error
    assert f"The router at {router.url} refused a request" in error.value
    assert "HTTP 401" in error.value and "is not the router's" in error.value


def test_the_page_shows_the_fleet_and_why_a_request_went_where_it_went(fleet_env, router):
    fleet_env.setenv("JUNCTION_ROUTER_URL", router.url + "/")
    at = open_page("fleet")
    assert "has routed no request yet" in texts(at)
    assert set(at.dataframe[0].value["engine"]) == set(ENGINE_IDS)

    answers = [chat(router, "question 0").json()]
    wait_for("the first answer's blocks in the router's index", lambda: keys(router) > 0)
    answers += [chat(router, f"question {i}").json() for i in (1, 2)]
    at = open_page("fleet", request=answers[-1]["id"])  # the engine's id finds it too
    fleet = get(router, "/fleet")
    engines = at.dataframe[0].value.set_index("engine")
    assert set(engines.index) == set(ENGINE_IDS)
    assert set(engines["status"]) == {"up"}
    for engine in fleet["engines"]:
        assert engines.loc[engine["engine_id"], "routed"] == engine["num_routed"]
        assert engines.loc[engine["engine_id"], "hit rate"] == pytest.approx(engine["hit_rate"])
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["policy"] == "hybrid" and metrics["requests routed"] == "3"
    assert metrics["engines up"] == "2 of 2"

    decision = get(router, f"/fleet/decisions/{answers[-1]['id']}")
    assert at.selectbox(key="fleet_request").value == decision["request_id"]
    assert decision["reason"] == "hit" and decision["predicted_hit"] > 0  # the shared prompt
    assert f"**{decision['request_id']}**" in texts(at) and "reason **hit**" in texts(at)
    share, scores = figures(at)
    by_name = {trace["name"]: trace for trace in scores["data"]}
    labels = [s["engine_id"] for s in decision["scores"]]
    assert by_name["score"]["x"] == labels
    assert by_name["score"]["y"] == [s["score"] for s in decision["scores"]]
    assert by_name["usable hybrid hit"]["y"] == [s["hit"] for s in decision["scores"]]
    widths = by_name["score"]["marker"]["line"]["width"]
    assert [labels[i] for i, w in enumerate(widths) if w] == [decision["engine_id"]]
    (note,) = scores["layout"]["annotations"]
    assert note["x"] == decision["engine_id"] and note["text"] == "chosen: hit"
    assert {t["name"] for t in share["data"]} == {"routed share", "hit rate"}


def test_a_request_the_router_does_not_know_is_said(fleet_env, router):
    fleet_env.setenv("JUNCTION_ROUTER_URL", router.url)
    chat(router, "one more")
    at = open_page("fleet", request="no-such-request")
    assert any("no decision 'no-such-request'" in w.value for w in at.warning)
    assert (
        at.selectbox(key="fleet_request").value
        == get(router, "/fleet/decisions")["decisions"][0]["request_id"]
    )


def test_the_fleet_page_in_a_browser(router: Process, tmp_path: Path):
    """The page as a person sees it, in headless Chromium (a screenshot, `fleet.png`, where
    `JUNCTION_SCREENSHOTS_DIR` says; docs/screenshots for the README)."""
    from playwright.sync_api import sync_playwright

    from tests.dashboard.test_browser import CHROMIUM_ARGS, screenshots_folder, shoot

    chromium = chromium_or_skip()
    other = "You answer questions about prefix caches for a hybrid model fleet. " * 10
    for question in ("What is a junction?", "And a pin?", "Why keep states?"):
        chat(router, question)
        chat(router, question, system=other)  # a second family: the other engine
    port = free_port()
    env = {**os.environ, "JUNCTION_API_TOKEN": TOKEN, "JUNCTION_DASHBOARD_REFRESH_S": "3600"}
    env["JUNCTION_CONTROL_PLANE_URL"] = f"http://127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "cli.main", "dashboard", "--port", str(port)]
    command += ["--router-url", router.url]
    dashboard = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    folder = screenshots_folder(dict(os.environ), tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        wait_for("junction dashboard", lambda: _healthy(url), 60)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1440, "height": 1300})
                page.goto(f"{url}/")  # the app's navigation first, as a person arrives
                page.get_by_role("link", name="Fleet").first.click(timeout=60_000)
                page.get_by_text("Why a request went where it went").first.wait_for(timeout=60_000)
                page.locator(".js-plotly-plot").nth(1).wait_for(timeout=30_000)
                page.wait_for_timeout(1000)
                shoot(page, folder, "fleet")
            finally:
                browser.close()
    finally:
        dashboard.terminate()
        dashboard.wait(10)
    assert (folder / "fleet.png").stat().st_size > 10_000


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/_stcore/health", timeout=1).text == "ok"
    except httpx.HTTPError:
        return False
