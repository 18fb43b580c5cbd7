"""A response's diagnosis equals the control plane's miss attribution of the same request, token
for token (issue 51, must-show 3), over real processes: `junction serve --runner torch` (the
tiny built-in model on the CPU) streaming its events to `junction api` on PostgreSQL, every
request asking for its diagnosis (the body's `junction.diagnose` or the `X-Junction-Diagnose`
header; completions, streamed and not, chat and messages).

The trace gives several reasons on one small engine (junction checkpoints off, 96 attention
blocks, 8 Mamba slots of 512 tokens, LRU eviction, no waiting for a prefix in flight): a family
diverging inside a Mamba block (`no_state`), an exact resend whose state a message checkpoint
kept (`held_back`), a burst of one new family admitted at once behind a request that holds the
blocks (`in_flight`; a new family again, up to 4 times, should the burst come after it: the
torch runner's steps are slow enough that it does not), and a flood that evicts a shared
prefix (`evicted`; on an engine with a small host tier, split by tier).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.api.conftest import api_on_postgres
from tests.api.processes import ApiProcess, Serve
from tests.api.test_attribution_e2e import requests_of

MODEL = "junction-hybrid-tiny"
SMALL = (
    "--block-size",
    "16",
    "--mamba-block-size",
    "512",
    "--prefix-match-unit",
    "16",
    "--num-blocks",
    "96",
    "--num-mamba-blocks",
    "8",
    "--no-junction-checkpoints",
    "--checkpoint-mode",
    "stops",
    "--eviction",
    "lru",
    "--max-num-batched-tokens",
    "2048",
    "--max-prefix-wait-steps",
    "0",
)
EVICTED = ("evicted", "evicted_host", "evicted_disk", "evicted_shared", "not_admitted")
DIAGNOSE = {"junction": {"diagnose": True}}


@pytest.fixture(scope="module")
def api(postgres) -> Iterator[ApiProcess]:
    with api_on_postgres(postgres, "junction_diagnosis") as process:
        yield process


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(32, 127) for _ in range(n)]  # printable: a text prompt of them too


class Client:
    """Sends the trace's requests; keeps each response's id and diagnosis."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.diagnoses: dict[str, dict] = {}

    def complete(self, prompt: list[int], max_tokens: int = 4, **extra) -> dict:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, **DIAGNOSE, **extra}
        answer = httpx.post(f"{self.url}/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        return self._keep(answer.json())

    def stream(self, prompt: list[int]) -> dict:
        """A streamed completion asking by header: the last chunk carries the diagnosis."""
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "stream": True}
        headers = {"X-Junction-Diagnose": "1"}
        with httpx.stream(
            "POST", f"{self.url}/v1/completions", json=body, headers=headers, timeout=60
        ) as answer:
            lines = [line for line in answer.iter_lines() if line.startswith("data: {")]
        chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
        assert all("junction" not in chunk for chunk in chunks[:-1])
        return self._keep(chunks[-1])

    def chat(self, text: str) -> dict:
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}], **DIAGNOSE}
        body["max_tokens"] = 4
        answer = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        return self._keep(answer.json())

    def message(self, text: str) -> dict:
        body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
        answer = httpx.post(f"{self.url}/v1/messages", json={**body, **DIAGNOSE}, timeout=60)
        assert answer.status_code == 200, answer.text
        return self._keep(answer.json())

    def _keep(self, body: dict) -> dict:
        diagnosis = body["junction"]["diagnosis"]
        assert diagnosis is not None, body
        self.diagnoses[body["id"]] = diagnosis
        return diagnosis


def burst(client: Client, rng: random.Random, size: int = 4) -> list[dict]:
    """One new family's requests sent at once, while a long request holds nearly every block:
    they wait until it finishes, then are admitted in one step, so every one after the first
    finds the family's prefix still being computed (`in_flight`)."""
    family = tokens(rng, 300)
    prompts = [family + tokens(rng, 20) for _ in range(size)]
    body = {"model": MODEL, "prompt": tokens(rng, 1300), "max_tokens": 200, "stream": True}
    with (
        httpx.stream(
            "POST",
            f"{client.url}/v1/completions",
            json=body,
            headers={"X-Junction-Diagnose": "1"},
            timeout=60,
        ) as blocker,
        ThreadPoolExecutor(size) as pool,
    ):
        lines = blocker.iter_lines()
        first = next(line for line in lines if line.startswith("data: {"))  # it was admitted
        sent = [pool.submit(client.complete, prompt, 4) for prompt in prompts]
        last = [first, *(line for line in lines if line.startswith("data: {"))][-1]
    client._keep(json.loads(last.removeprefix("data: ")))
    return [future.result() for future in sent]


def run_trace(client: Client, rng: random.Random) -> None:
    system = tokens(rng, 600)
    first = client.complete(system + tokens(rng, 50))
    assert first["diverged_at"] == 0 and sum(first["missed_tokens"].values()) == 0
    second = client.complete(system + tokens(rng, 50))
    assert second["missed_tokens"]["no_state"] == 80  # attention matched 592, the state at 512
    resend = tokens(rng, 640)
    client.complete(resend, checkpoint_offsets=[624])  # a message's state kept at 624
    again = client.stream(resend)
    assert again["hit_stopped_at"] == 624 and again["missed_tokens"]["held_back"] == 16
    client.chat(bytes(system[:400]).decode())
    client.message(bytes(system[:400]).decode())
    for _ in range(4):
        if any(d["missed_tokens"]["in_flight"] for d in burst(client, rng)):
            break
    for _ in range(12):
        client.complete(tokens(rng, 700))
    evicted = client.complete(system + tokens(rng, 50))
    assert sum(evicted["missed_tokens"][reason] for reason in EVICTED) > 0, evicted


@pytest.mark.parametrize(
    ("host_bytes", "evicted_as"),
    [("0", {"evicted"}), ("1MiB", {"evicted_host", "not_admitted"})],
    ids=["no-tier", "host-tier"],
)
def test_every_diagnosis_equals_the_stores_attribution(api, host_bytes, evicted_as):
    """Without tiers the flood's misses are `evicted`; with a host tier of 1 MiB (two Mamba
    states) they split by tier: given up by host memory too, or never taken by it."""
    engine_id = f"diagnosis-{host_bytes.lower()}"
    geometry = (*SMALL, "--host-cache-bytes", host_bytes)
    serve = Serve(api, engine_id, runner="torch", geometry=geometry)
    try:
        client = Client(serve.url)
        run_trace(client, random.Random(51))
    finally:
        serve.stop()
    rows = requests_of(api, engine_id)
    assert set(rows) == set(client.diagnoses)
    seen: set[str] = set()
    for request_id, diagnosis in client.diagnoses.items():
        row = rows[request_id]
        attribution = row["attribution"]
        assert diagnosis["missed_tokens"] == attribution["missed_tokens"], request_id
        assert diagnosis["diverged_at"] == attribution["shared_tokens"], request_id
        assert diagnosis["oracle_tokens"] == attribution["oracle_tokens"], request_id
        assert diagnosis["stop_reason"] == attribution["stop_reason"], request_id
        assert diagnosis["hit_stopped_at"] == row["num_cached_tokens"], request_id
        assert diagnosis["epoch"] == row["epoch"], request_id
        assert set(diagnosis["remedies"]) == {r for r, n in diagnosis["missed_tokens"].items() if n}
        seen |= {reason for reason, n in diagnosis["missed_tokens"].items() if n}
    assert {"no_state", "held_back", "in_flight"} <= seen, seen
    assert seen & evicted_as and not seen & (set(EVICTED) - evicted_as), seen
