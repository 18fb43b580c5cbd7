"""The engine's cache feed (`WS /v1/cache/feed`) read directly, as a router reads it: refused
without the engine's token or on an engine that has none, then a hello, a snapshot, and a
delta per step that names the keys the cache stored and the requests that finished."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Close
from websockets.sync.client import ClientConnection, connect

from engine.feed import FeedDelta, FeedFinished, FeedHeartbeat, FeedHello, FeedSnapshot, decode
from engine.hashing import hash_prefix
from engine.model.hf.tokenizer import load_tokenizer
from protocol.prompts import chat_prompt
from protocol.schemas import ChatCompletionRequest
from tests.router.processes import AUTH, MODEL, TOKEN, Process, start_engine
from tests.serve.conftest import text_prompt

RECV_TIMEOUT_S = 10  # a frame comes at least every heartbeat (0.5 s)
ATTENTION = 0


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Process]]:
    log_dir = tmp_path_factory.mktemp("feed")
    started = {
        "fed": start_engine(log_dir, "fed"),
        "tokenless": start_engine(log_dir, "tokenless", token=None),
    }
    try:
        for engine in started.values():
            engine.wait_healthy()
        yield started
    finally:
        for engine in started.values():
            engine.stop()


def feed_url(engine: Process) -> str:
    return f"ws://127.0.0.1:{engine.port}/v1/cache/feed"


def closed_with(engine: Process, headers: dict[str, str]) -> Close:
    """How the engine closes a feed it refuses (the close frame it sent)."""
    try:
        with connect(feed_url(engine), additional_headers=headers, open_timeout=10) as socket:
            frame = socket.recv(timeout=RECV_TIMEOUT_S)
    except ConnectionClosed as exc:
        assert exc.rcvd is not None, "the feed closed without a close frame"
        return exc.rcvd
    except InvalidStatus as exc:
        pytest.fail(
            f"the handshake was refused with HTTP {exc.response.status_code}: a close code "
            "only reaches the client after the engine accepts the websocket"
        )
    pytest.fail(f"the feed was served: {decode(frame)!r}")


def frame(socket: ClientConnection):
    return decode(socket.recv(timeout=RECV_TIMEOUT_S))


def test_without_the_token_it_closes_4401(engines: dict[str, Process]) -> None:
    for headers in ({}, {"Authorization": "Bearer not-" + TOKEN}, {"Authorization": TOKEN}):
        assert closed_with(engines["fed"], headers).code == 4401, headers


def test_an_engine_without_a_token_serves_no_feed(engines: dict[str, Process]) -> None:
    close = closed_with(engines["tokenless"], AUTH)
    assert close.code == 4403
    assert "--token" in close.reason


def test_hello_snapshot_then_a_delta_per_step(engines: dict[str, Process]) -> None:
    engine = engines["fed"]
    messages = [{"role": "user", "content": text_prompt(7, 300)}]
    parsed = ChatCompletionRequest(model=MODEL, messages=messages).messages
    token_ids = chat_prompt(load_tokenizer(None), parsed).token_ids

    with connect(feed_url(engine), additional_headers=AUTH, max_size=None) as socket:
        hello = frame(socket)
        assert isinstance(hello, FeedHello), hello
        assert (hello.engine_id, hello.model) == ("fed", MODEL)
        assert hello.max_request_tokens > len(token_ids)
        snapshot = frame(socket)
        assert isinstance(snapshot, FeedSnapshot), snapshot
        first_unit = hash_prefix(token_ids, hello.geometry.match_unit)[0]
        assert first_unit not in snapshot.attention

        done = engine.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
        assert done.usage.prompt_tokens == len(token_ids)

        stored: set[bytes] = set()
        seq = snapshot.seq
        finished: FeedFinished | None = None
        while finished is None:  # deltas follow the snapshot seq by seq until it finishes
            next_frame = frame(socket)
            if isinstance(next_frame, FeedHeartbeat):
                assert next_frame.seq == seq
                continue
            assert isinstance(next_frame, FeedDelta), next_frame
            assert next_frame.seq == seq + 1
            seq = next_frame.seq
            for change in next_frame.changes:
                if change.op == "store" and change.group == ATTENTION:
                    stored.update(change.keys)
            finished = next((f for f in next_frame.finished if f.request_id == done.id), None)
        # the keys are announced no later than the request's end: a router that waits for the
        # end has them in its index before the client's next turn
        assert first_unit in stored
        assert finished.num_prompt_tokens == len(token_ids)
        assert finished.num_cached_tokens == done.usage.prompt_tokens_details.cached_tokens

    with connect(feed_url(engine), additional_headers=AUTH, max_size=None) as socket:
        assert isinstance(frame(socket), FeedHello)
        later = frame(socket)
        assert isinstance(later, FeedSnapshot)
        assert later.seq >= seq
        assert first_unit in later.attention  # cached after the request: in the next snapshot
