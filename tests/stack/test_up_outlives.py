"""`junction up --engines 3` outlives an engine (issue 50): `kill -9` of one engine's pid while
streams run through the router with the `openai` client. The other streams finish; the engine
is started again under the same id and port, the router's `/fleet` shows it up again and the
router sends requests to it again; every request a client got whole is in the store (the API's
requests list). Then an engine killed each time it starts keeps dying: it is left down with its
last lines reported, while the rest of the stack serves on; Ctrl-C stops it all."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import openai

from tests.api.processes import free_port
from tests.polling import wait_for
from tests.serve.conftest import text_prompt
from tests.stack.test_up import Up, is_alive
from tests.stack.test_up_engines import engine_port

MODEL = "junction-hybrid-tiny"
NUM_STREAMS = 6
STREAM_TOKENS = 3000  # long enough to be streaming still when the engine is killed


class Stream(threading.Thread):
    """One streamed completion through the router: the engine that served it, its request
    id, and whether it came whole (its usage chunk, every token)."""

    def __init__(self, client: openai.OpenAI, seed: int) -> None:
        super().__init__(daemon=True)
        self.client, self.seed = client, seed
        self.engine_id: str | None = None
        self.request_id: str | None = None
        self.num_tokens: int | None = None
        self.error: Exception | None = None
        self.is_streaming = threading.Event()

    def run(self) -> None:
        try:
            with self.client.completions.with_streaming_response.create(
                model=MODEL,
                prompt=text_prompt(self.seed, 200),
                max_tokens=STREAM_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
            ) as response:
                self.engine_id = response.headers["X-Junction-Engine-Id"]
                for chunk in response.parse():
                    self.request_id = chunk.id
                    self.is_streaming.set()
                    if chunk.usage is not None:
                        self.num_tokens = chunk.usage.completion_tokens
        except (openai.APIError, httpx.HTTPError) as exc:
            self.error = exc
        finally:
            self.is_streaming.set()


def test_junction_up_outlives_an_engine_killed_during_a_stream(tmp_path: Path):
    port, api_port = engine_port(3), free_port()
    api = f"http://127.0.0.1:{api_port}"
    up = Up(
        tmp_path,
        *("--engines", "3", "--runner", "null", "--no-jobs", "--engine-port", str(port)),
        *("--api-port", str(api_port), "--dashboard-port", str(free_port())),
    )
    try:
        up.wait_for_line("URLs", lambda line: line == "Junction is up:", 180)
        auth = {"Authorization": f"Bearer {(tmp_path / 'junction-api-token').read_text().strip()}"}

        def fleet() -> dict[str, str]:
            engines = httpx.get(f"http://127.0.0.1:{port}/fleet", headers=auth).json()["engines"]
            return {engine["engine_id"]: engine["status"] for engine in engines}

        wait_for("the three engines up in the router", lambda: set(fleet().values()) == {"up"}, 30)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        victim, survivors = kill_during_streams(up, client)
        wait_for(f"{victim} up again in the router", lambda: fleet()[victim] == "up", 60)
        assert set(fleet().values()) == {"up"}
        # started again with the same command line: its id and its port
        (started, *_) = [ln for ln in up.lines if f"| started (pid {up.pids()[victim]})" in ln]
        victim_port = port + 1 + int(victim.removeprefix("engine-"))
        assert f"--port {victim_port} " in started and f"--engine-id {victim} " in started

        later = routed_to(client, victim)
        got: dict[str, set[str]] = {}
        for engine_id, request_id in [(s.engine_id, s.request_id) for s in survivors] + later:
            got.setdefault(engine_id, set()).add(request_id)
        # the restarted engine is accepted once the killed one's lease is over (15 s)
        wait_for("every finished request in the store", lambda: not missing(api, auth, got), 60)
        keeps_dying(up, fleet, client, next(e for e in fleet() if e != victim))
    finally:
        pids = up.pids()
        code = up.interrupt()
    assert code == 1, up.log[-4000:]  # an engine was left down: said in the exit code
    assert "every part stopped" in up.log
    deadline = time.monotonic() + 10
    while any(is_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, pid in pids.items() if is_alive(pid)], up.log[-4000:]


def kill_during_streams(up: Up, client: openai.OpenAI) -> tuple[str, list[Stream]]:
    """`kill -9` of the engine serving the first of `NUM_STREAMS` streams once its first chunk
    came; the engine killed, and the streams on the others, each finished whole."""
    streams = [Stream(client, seed) for seed in range(NUM_STREAMS)]
    for stream in streams:
        stream.start()
    assert streams[0].is_streaming.wait(60) and streams[0].error is None, streams[0].error
    victim = streams[0].engine_id
    old_pid = up.pids()[victim]
    os.kill(old_pid, signal.SIGKILL)
    for stream in streams:
        stream.join(120)
    assert streams[0].error is not None  # cut mid-stream: the router does not retry it
    assert all(s.engine_id is not None for s in streams), [s.error for s in streams]  # routed
    survivors = [s for s in streams if s.engine_id != victim]
    assert survivors, [s.error for s in streams]
    tokens = [s.num_tokens for s in survivors]
    assert tokens == [STREAM_TOKENS] * len(survivors), [s.error for s in survivors]
    restart = rf"{victim} \| exited with code -9: restart 1 in [\d.]+ s \(exits: 1 of 5 in 60 s\)"
    up.wait_for_line(f"{victim}'s restart", lambda line: re.search(restart, line), 10)
    wait_for(f"{victim} started again", lambda: up.pids()[victim] != old_pid, 30)
    return victim, survivors


def routed_to(client: openai.OpenAI, engine_id: str) -> list[tuple[str, str]]:
    """Requests of new prompts (no hit anywhere: they go to the least loaded) until one goes
    to `engine_id`; each one's engine id and request id."""
    sent = []
    for seed in range(100, 112):
        reply = client.completions.with_raw_response.create(
            model=MODEL, prompt=text_prompt(seed, 200), max_tokens=4
        )
        sent.append((reply.headers["X-Junction-Engine-Id"], reply.parse().id))
        if sent[-1][0] == engine_id:
            return sent
    raise AssertionError(f"the router sent none to {engine_id}: {sent}")


def missing(api: str, auth: dict, got: dict[str, set[str]]) -> dict[str, set[str]]:
    """The request ids in `got` (by engine id) that the API's requests list lacks."""
    gone = {}
    for engine_id, request_ids in got.items():
        url = f"{api}/api/v1/engines/{engine_id}/requests?limit=1000"
        stored = {r["request_id"] for r in httpx.get(url, headers=auth).json()["requests"]}
        if request_ids - stored:
            gone[engine_id] = request_ids - stored
    return gone


def keeps_dying(up: Up, fleet, client: openai.OpenAI, victim: str) -> None:
    """`victim` killed each time it starts: left down after its 5th exit in 60 s, its last
    lines reported; the others serve on."""
    killed = set()
    deadline = time.monotonic() + 60
    while not any(f"{victim} | exited with code -9 and keeps dying" in ln for ln in up.lines):
        assert time.monotonic() < deadline, up.log[-4000:]
        pid = up.pids()[victim]
        if pid not in killed:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.05)
    assert len(killed) == 5
    report = next(i for i, ln in enumerate(up.lines) if f"{victim} | exited with code -9 and" in ln)
    num_lines = int(re.search(r"its last (\d+) lines:$", up.lines[report]).group(1))
    assert 1 <= num_lines <= 20  # bounded
    said = {ln.split(" | ", 1)[1] for ln in up.lines[:report] if ln.startswith(f" {victim} | ")}
    tail = up.lines[report + 1 : report + 1 + num_lines]
    assert all(ln.startswith(f" {victim} |     ") for ln in tail), tail
    assert all(ln.split(" | ", 1)[1][4:] in said for ln in tail)  # its own lines, again
    assert f"junction up: {victim} keeps dying (exit code -9): left down" in up.log
    time.sleep(3)  # past the longest backoff: it is not started again
    assert len([ln for ln in up.lines if f"{victim} | started (pid" in ln]) == 5
    wait_for(f"{victim} down in the router", lambda: fleet()[victim] == "down", 30)
    for seed in range(200, 204):  # the rest serve on
        reply = client.completions.with_raw_response.create(
            model=MODEL, prompt=text_prompt(seed, 200), max_tokens=4
        )
        assert reply.headers["X-Junction-Engine-Id"] != victim
