"""The whole stack in a real browser: `junction api` seeded by a replay, a live `junction serve
--runner ledger` connected to it, `junction dashboard` on a free port, and headless Chromium
(Debian's package, driven by Playwright). Every page renders and is saved as a
screenshot (in a temporary folder; `JUNCTION_SCREENSHOTS_DIR=docs/screenshots` refreshes the
README's); a prefix pinned through the form becomes materialized on the live engine;
the block table of a 100,000-block engine renders in under 3 seconds. The miss attribution's
views (the Overview's stacked reasons and remedies, the Requests page's reasons) render for an
engine that replayed the known cases. The Peer cache page renders for a vLLM engine fed by
hash-keyed peer events. The What-if page draws a done run's curve and ranked settings. An
engine that loaded a prefix back from its host tier shows hits by tier on three pages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.processes import AUTH, TOKEN, Serve, free_port
from tests.dashboard.conftest import Stack, chromium_or_skip
from tests.dashboard.peer_engine import PEER_ENGINE, ensure_peer_engine
from tests.dashboard.test_attribution_pages import ATTRIBUTION_ENGINE, ensure_attribution_engine
from tests.dashboard.test_pages import BIG_ENGINE, ensure_big_engine
from tests.dashboard.whatif_run import ensure_whatif
from tests.polling import wait_for
from tests.serve.conftest import text_prompt

ROOT = Path(__file__).parents[2]
# Where the screenshots go: a temporary folder, so a run leaves the tracked README images
# alone, unless JUNCTION_SCREENSHOTS_DIR says where (relative to the repository root), e.g.
#   JUNCTION_SCREENSHOTS_DIR=docs/screenshots pytest tests/dashboard/test_browser.py
SCREENSHOTS_DIR_VARIABLE = "JUNCTION_SCREENSHOTS_DIR"
LIVE_ENGINE = "live-0"
PROMPT = ("You are the Junction support bot. Answer in one short, friendly sentence. " * 8)[:560]
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def dashboard_url(stack: Stack) -> Iterator[str]:
    """`junction dashboard` against the stack, refreshing every second."""
    port = free_port()
    env = {
        **os.environ,
        "JUNCTION_API_TOKEN": TOKEN,
        "JUNCTION_DASHBOARD_REFRESH_S": "1",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "dashboard",
            "--port",
            str(port),
            "--api-url",
            stack.url,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"junction dashboard exited: {process.stderr.read().decode()}")
        try:
            return httpx.get(f"{url}/_stcore/health", timeout=1).text == "ok"
        except httpx.HTTPError:
            return False

    try:
        wait_for("junction dashboard", healthy, timeout_s=60)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def live_engine(stack: Stack) -> Iterator[Serve]:
    """A ledger engine serving requests and taking pin commands, with a few requests done."""
    serve = Serve(stack.api, LIVE_ENGINE, runner="ledger")
    try:
        for seed in range(4):
            serve.ask(PROMPT + text_prompt(seed, 200))
        yield serve
    finally:
        serve.stop()


def screenshots_folder(environ: dict[str, str], scratch: Path) -> Path:
    """`JUNCTION_SCREENSHOTS_DIR` (relative to the repository root), else `scratch`."""
    asked = environ.get(SCREENSHOTS_DIR_VARIABLE, "").strip()
    return ROOT / asked if asked else scratch


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """The folder the screenshots go to (made if need be)."""
    folder = screenshots_folder(dict(os.environ), tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_screenshots_leave_the_readmes_alone_unless_asked(tmp_path: Path) -> None:
    """No browser needed: where a run would write."""
    assert screenshots_folder({}, tmp_path) == tmp_path
    assert screenshots_folder({SCREENSHOTS_DIR_VARIABLE: ""}, tmp_path) == tmp_path
    asked = screenshots_folder({SCREENSHOTS_DIR_VARIABLE: "docs/screenshots"}, tmp_path)
    assert asked == ROOT / "docs" / "screenshots" and asked.is_dir()


def shoot(page, folder: Path, name: str) -> None:
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


@pytest.fixture
def chromium() -> str:
    return chromium_or_skip()


def test_the_dashboard_in_a_browser(
    chromium: str, stack: Stack, live_engine: Serve, dashboard_url: str, screenshots: Path
):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1300})
            page.goto(f"{dashboard_url}/")
            page.get_by_text("token hit rate").first.wait_for(timeout=60_000)
            page.locator(".js-plotly-plot").nth(2).wait_for(timeout=30_000)
            page.wait_for_timeout(1000)
            shoot(page, screenshots, "overview")

            page.goto(f"{dashboard_url}/block_tables?engine=replay-0&request=q3")
            page.get_by_text("Request q3").first.wait_for(timeout=30_000)
            page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1000)
            shoot(page, screenshots, "block_tables")

            page.goto(f"{dashboard_url}/block_tables?engine=replay-0&group=mamba&request=q3")
            page.get_by_text("Recent copies and moves").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1000)
            shoot(page, screenshots, "block_tables_mamba")

            page.goto(f"{dashboard_url}/requests?engine=replay-0")
            page.get_by_text("newest of").first.wait_for(timeout=30_000)
            page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1000)
            shoot(page, screenshots, "requests")

            page.goto(f"{dashboard_url}/checkpoints")
            page.get_by_text("Suggested junctions").first.wait_for(timeout=30_000)
            write_token = page.get_by_label("Write token", exact=True)  # not its help button
            write_token.fill(TOKEN)  # the visitor's, for the writes
            write_token.press("Enter")
            page.get_by_label("Prefix text").fill(PROMPT)
            page.get_by_text("pasted text", exact=True).click()  # the completions below
            page.get_by_label("Label").fill("support bot")
            page.get_by_role("button", name="Pin", exact=True).click()
            materialized = re.compile(rf"{LIVE_ENGINE}: materialized at token 560")
            page.get_by_text(materialized).first.wait_for(timeout=60_000)
            pins = httpx.get(f"{stack.url}/api/v1/pins", headers=AUTH, timeout=10).json()
            (pin,) = [p for p in pins if p["label"] == "support bot"]
            assert {t["engine_id"]: t["state"] for t in pin["engines"]}[LIVE_ENGINE] == (
                "materialized"
            )
            page.wait_for_timeout(1000)
            shoot(page, screenshots, "checkpoints")

            page.goto(f"{dashboard_url}/benchmarks")
            page.get_by_text("Token hit rate by mode").first.wait_for(timeout=30_000)
            page.locator(".js-plotly-plot").nth(1).wait_for(timeout=30_000)
            page.wait_for_timeout(1000)
            shoot(page, screenshots, "benchmarks")

            ensure_big_engine(stack)
            page.goto(f"{dashboard_url}/checkpoints")  # the app's code is loaded and warm
            page.get_by_text("Suggested junctions").first.wait_for(timeout=30_000)
            started = time.perf_counter()
            page.goto(f"{dashboard_url}/block_tables?engine={BIG_ENGINE}")
            page.locator(".js-plotly-plot .heatmaplayer image").first.wait_for(
                state="attached", timeout=30_000
            )
            page.get_by_text("100,000 attention blocks").first.wait_for(timeout=30_000)
            elapsed = time.perf_counter() - started
            print(f"\nblock tables page at 100,000 blocks rendered in {elapsed:.2f} s")
            page.wait_for_timeout(1000)
            shoot(page, screenshots, "block_tables_100k")  # the time is printed, not asserted
        finally:
            browser.close()


def pause_live_refresh(page) -> None:
    """Pause the live refresh: a rerun neither closes an open drop-down nor fades the page
    while a shot is taken."""
    page.get_by_text("Pause live refresh").click()
    page.get_by_text("Paused.").first.wait_for(timeout=30_000)


def test_the_attribution_views_in_a_browser(
    chromium: str, stack: Stack, dashboard_url: str, screenshots: Path, tmp_path: Path
):
    from playwright.sync_api import sync_playwright

    ensure_attribution_engine(stack, tmp_path)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:  # tall, so a shot holds the section below the hit rate (the page scrolls inside)
            page = browser.new_page(viewport={"width": 1440, "height": 2300})
            page.goto(f"{dashboard_url}/?engine={ATTRIBUTION_ENGINE}")
            page.get_by_text("Why shared tokens missed").first.wait_for(timeout=60_000)
            pause_live_refresh(page)
            page.get_by_text("the remedy would have saved").first.wait_for(timeout=30_000)
            page.get_by_text("Pin these boundaries").first.wait_for(timeout=30_000)
            page.locator(".js-plotly-plot").nth(3).wait_for(timeout=30_000)
            page.wait_for_timeout(1500)
            shoot(page, screenshots, "overview_attribution")

            page.goto(f"{dashboard_url}/requests?engine={ATTRIBUTION_ENGINE}")
            shown = page.get_by_text("What each request shared, hit and missed")
            shown.first.wait_for(timeout=30_000)
            pause_live_refresh(page)
            page.get_by_label("Request (its reasons, remedies and prefill timeline)").click()
            page.get_by_role("option", name="n2", exact=True).click()
            page.get_by_text("Pin this boundary (token 96)").first.wait_for(timeout=30_000)
            page.locator(".js-plotly-plot").nth(1).wait_for(timeout=30_000)
            page.wait_for_timeout(1500)
            shoot(page, screenshots, "requests_attribution")
        finally:
            browser.close()


def test_the_peer_cache_page_in_a_browser(
    chromium: str, stack: Stack, dashboard_url: str, screenshots: Path
):
    """A vLLM engine attached by hash-keyed events: its page draws the prefix tree with the
    Mamba states and suggested junctions, and the block tables say why it has none."""
    from playwright.sync_api import sync_playwright

    ensure_peer_engine(stack)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:  # tall: the page scrolls inside, and the cards are below the tree
            page = browser.new_page(viewport={"width": 1440, "height": 2600})
            page.goto(f"{dashboard_url}/")  # the app's navigation first: it names the pages
            page.get_by_text("Peer cache").first.wait_for(timeout=60_000)
            page.goto(f"{dashboard_url}/peer_cache?engine={PEER_ENGINE}")
            page.get_by_text("Cached prefixes").first.wait_for(timeout=60_000)
            pause_live_refresh(page)
            page.get_by_text("Junction at token 720").first.wait_for(timeout=30_000)
            page.get_by_text("could not fill").first.wait_for(timeout=30_000)
            page.locator(".js-plotly-plot").nth(3).wait_for(timeout=30_000)
            page.wait_for_timeout(1500)
            shoot(page, screenshots, "peer_cache")

            page.get_by_test_id("stRadioGroup").get_by_text("mamba", exact=True).click()
            page.get_by_text("mamba blocks of 16 tokens").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1500)
            shoot(page, screenshots, "peer_cache_mamba")

            page.set_viewport_size({"width": 1440, "height": 900})
            page.goto(f"{dashboard_url}/block_tables?engine={PEER_ENGINE}")
            page.get_by_text(f"{PEER_ENGINE} is a vLLM engine").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1000)
            shoot(page, screenshots, "peer_cache_block_tables")
        finally:
            browser.close()


def test_the_whatif_page_in_a_browser(
    chromium: str, stack: Stack, dashboard_url: str, screenshots: Path
):
    """A done what-if of the replayed engine: the agreement line, the curve of hit rate
    against memory, and the settings ranked by tokens saved."""
    from playwright.sync_api import sync_playwright

    from tests.dashboard.conftest import REPLAY_ENGINE

    run = ensure_whatif(stack)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:  # tall: the report is below the form
            page = browser.new_page(viewport={"width": 1440, "height": 2000})
            page.goto(f"{dashboard_url}/")  # the app's navigation first: it names the pages
            page.get_by_text("What-if").first.wait_for(timeout=60_000)
            page.goto(f"{dashboard_url}/whatif?engine={REPLAY_ENGINE}&run={run['id']}")
            page.get_by_text("Token hit rate against memory").first.wait_for(timeout=60_000)
            pause_live_refresh(page)
            page.get_by_text("Replaying its own settings reproduces").first.wait_for(timeout=30_000)
            page.get_by_text("most tokens saved first").first.wait_for(timeout=30_000)
            page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1500)
            shoot(page, screenshots, "whatif")
        finally:
            browser.close()


TIER_ENGINE = "tiers-0"


def test_the_tier_views_in_a_browser(
    chromium: str, stack: Stack, dashboard_url: str, screenshots: Path
):
    """An engine whose device pool a flood overflows into its host tier, and a request that
    then loads its prefix back from there: the Overview's hits by tier, the Block tables'
    units below the device and the Requests page's hit by tier all show it (issue 49)."""
    from playwright.sync_api import sync_playwright

    serve = Serve(stack.api, TIER_ENGINE, "--host-cache-bytes", "256MiB", runner="ledger")
    try:
        prompt = PROMPT + text_prompt(900, 200)
        serve.ask(prompt)
        serve.flood(9)  # the device pool gives the prefix up: down to host memory
        assert serve.ask(prompt) > 0  # loaded back from host memory

        def stored_by_tier() -> bool:
            rows = httpx.get(
                f"{stack.url}/api/v1/engines/{TIER_ENGINE}/requests", headers=AUTH, timeout=10
            ).json()["requests"]
            return any((r.get("hit_tokens_by_tier") or {}).get("host") for r in rows)

        wait_for("the store to hold a hit from host memory", stored_by_tier, 60)
    finally:
        serve.stop()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 2300})
            page.goto(f"{dashboard_url}/?engine={TIER_ENGINE}")
            page.get_by_text("Where hits came from").first.wait_for(timeout=60_000)
            pause_live_refresh(page)
            page.wait_for_timeout(1500)
            shoot(page, screenshots, "overview_tiers")

            page.goto(f"{dashboard_url}/block_tables?engine={TIER_ENGINE}")
            page.get_by_text("Below the device").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1000)
            shoot(page, screenshots, "block_tables_tiers")

            page.goto(f"{dashboard_url}/requests?engine={TIER_ENGINE}")
            # the newest request, chosen first: its hit loaded back from host memory
            page.get_by_text(re.compile(r"\d from host")).first.wait_for(timeout=30_000)
            page.wait_for_timeout(1000)
            shoot(page, screenshots, "requests_tiers")
        finally:
            browser.close()
