"""Pins end to end over real processes: `junction api` on PostgreSQL, `junction serve` with the
torch runner on the CPU streaming to it, the official `openai` client sending requests.

1. A 560-token system prompt pinned by text through the REST API is hit by the first request
   and by every later one while unrelated requests fill the cache several times over; after
   the unpin, a flood evicts it and the hits stop.
2. Without a pin but with junction checkpoints the first request misses and later ones hit,
   and the suggested junctions name the 560-token boundary first.
"""

from __future__ import annotations

import os
import random
import string
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
import openai

from tests.api.processes import TOKEN, ApiProcess, free_port

SYSTEM = ("You are the Junction test assistant. Answer in one short sentence. " * 9)[:560]
GEOMETRY = [
    "--block-size",
    "16",
    "--mamba-block-size",
    "512",
    "--prefix-match-unit",
    "16",
    "--num-blocks",
    "160",
    "--num-mamba-blocks",
    "32",
]


def text(seed: int, length: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_letters + " ") for _ in range(length))


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Serve:
    def __init__(self, api: ApiProcess, engine_id: str, *extra: str) -> None:
        self.engine_id = engine_id
        self.port = free_port()
        env = {**os.environ, "JUNCTION_API_TOKEN": TOKEN}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine.cli",
                "serve",
                "--port",
                str(self.port),
                "--runner",
                "torch",
                "--device",
                "cpu",
                "--engine-id",
                engine_id,
                "--control-plane",
                api.url,
                "--token",
                TOKEN,
                "--log-level",
                "warning",
                *GEOMETRY,
                *extra,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        base = f"http://127.0.0.1:{self.port}"

        def healthy() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(self.process.stderr.read().decode())
            try:
                return httpx.get(f"{base}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("junction serve", healthy)
        self.client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        wait_for("the engine to connect", lambda: api_engine(api, engine_id).get("connected"))

    def ask(self, prompt: str) -> int:
        """Sends one completion; returns its hit length (cached prompt tokens)."""
        done = self.client.completions.create(
            model="junction-hybrid-tiny", prompt=prompt, max_tokens=1, temperature=0
        )
        return done.usage.prompt_tokens_details.cached_tokens

    def flood(self, seed: int, num: int = 12) -> None:
        for i in range(num):
            self.ask(text(seed * 100 + i, 700))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()


def api_engine(api: ApiProcess, engine_id: str) -> dict:
    response = httpx.get(f"{api.url}/api/v1/engines/{engine_id}", timeout=5)
    return response.json() if response.status_code == 200 else {}


def pin_state(api: ApiProcess, pin_id: str, engine_id: str) -> str | None:
    pin = httpx.get(f"{api.url}/api/v1/pins/{pin_id}", timeout=5).json()
    for target in pin["engines"]:
        if target["engine_id"] == engine_id:
            return target["state"]
    return None


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_pinned_system_prompt_is_hit_through_a_flood_until_unpinned(api_process):
    api = api_process
    serve = Serve(api, "e2e-pin")
    try:
        created = httpx.post(
            f"{api.url}/api/v1/pins",
            headers=AUTH,
            timeout=10,
            json={"prefix": {"text": SYSTEM}, "label": "system prompt"},
        )
        assert created.status_code == 201, created.text
        pin = created.json()
        assert pin["num_tokens"] == 560
        wait_for(
            "the pin to materialize",
            lambda: pin_state(api, pin["pin_id"], "e2e-pin") == "materialized",
        )
        assert serve.ask(SYSTEM + "What is a Mamba layer?") == 560  # the very first request
        serve.flood(1)
        assert serve.ask(SYSTEM + "What is attention?") == 560
        serve.flood(2)
        assert serve.ask(SYSTEM + "What is a junction?") == 560

        def saved_three() -> bool:
            shown = httpx.get(f"{api.url}/api/v1/pins/{pin['pin_id']}", timeout=5).json()
            return shown["tokens_saved"] >= 3 * 560

        wait_for("the hits to reach the store", saved_three)

        gone = httpx.delete(f"{api.url}/api/v1/pins/{pin['pin_id']}", headers=AUTH, timeout=10)
        assert gone.status_code in (200, 204), gone.text
        wait_for("the release", lambda: pin_state(api, pin["pin_id"], "e2e-pin") == "released")
        serve.flood(3)
        assert serve.ask(SYSTEM + "What is a pin?") < 560
    finally:
        serve.stop()


def test_junction_checkpoints_hit_after_the_first_and_the_boundary_is_suggested(api_process):
    api = api_process
    serve = Serve(api, "e2e-junction", "--junction-checkpoints")
    try:
        hits = [
            serve.ask(SYSTEM + question)
            for question in (
                "What is a Mamba layer?",
                "What is attention?",
                "Why pin?",
                "Why hybrid?",
            )
        ]
        assert hits[0] == 0
        assert all(hit > 0 for hit in hits[1:]) and hits[-1] == 560
        wait_for(
            "the requests to reach the store",
            lambda: api_engine(api, "e2e-junction").get("num_requests", 0) >= 4,
        )
        suggested = httpx.get(f"{api.url}/api/v1/junctions/suggested", timeout=10).json()
        first = suggested["junctions"][0] if isinstance(suggested, dict) else suggested[0]
        assert first["boundary"] == 560
        pinned = httpx.post(
            f"{api.url}/api/v1/pins", headers=AUTH, json=first["pin_request"], timeout=10
        )
        assert pinned.status_code == 201, pinned.text
        wait_for(
            "the suggested pin",
            lambda: pin_state(api, pinned.json()["pin_id"], "e2e-junction") == "materialized",
        )
    finally:
        serve.stop()
