"""The router's relay, against engines whose HTTP side misbehaves while their feeds stay up.

The engines here are `FleetEngine`s brought up by hand (a hello and an empty snapshot: their
feeds speak), and their OpenAI servers are an `httpx.MockTransport` the test scripts: one that
refuses connections, one that fails after the request was sent, one that answers. Every
request that reaches an engine's server is recorded, so the tests count them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
from fastapi.testclient import TestClient

from engine.cache.lookup import HitGeometry
from engine.feed import FeedHello, FeedLoad, FeedSnapshot
from engine.model.hf.tokenizer import load_tokenizer
from router.app import create_app
from router.caches.index import EngineIndex
from router.engines import FleetEngine
from router.fleet import Fleet
from router.policies import make_policy

MODEL = "m"
TOKEN = "t0ken"
GEOMETRY = HitGeometry(16, 16, 16, 0, True, True)
URLS = ["http://engine-a", "http://engine-b"]
Handler = Callable[[httpx.Request], httpx.Response]


def up_engine(url: str, max_request_tokens: int = 1 << 20) -> FleetEngine:
    """An engine whose feed has spoken: a hello and an empty snapshot."""
    engine = FleetEngine(url)
    engine.hello = FeedHello(url, 0, GEOMETRY, MODEL, max_request_tokens, reports_finished=False)
    engine.index = EngineIndex(GEOMETRY)
    engine.index.apply_snapshot(FeedSnapshot(0, [], [], FeedLoad(0, 0, 0, 0.0, 0.0)))
    engine.status = "up"
    return engine


@contextmanager
def router(engines: list[FleetEngine], handler: Handler) -> Iterator[TestClient]:
    """The router's app over `engines`, its requests to them answered by `handler`."""
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    fleet = Fleet(engines, make_policy("hybrid"))
    app = create_app(fleet, load_tokenizer(None), (TOKEN,), client=client)
    with TestClient(app) as test_client:
        yield test_client


def completion(request: httpx.Request) -> httpx.Response:
    """An engine's answer to a completion, naming the tokens it found cached."""
    usage = {
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "total_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    choice = {"index": 0, "text": "x", "finish_reason": "length"}
    body = {"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": usage}
    return httpx.Response(200, json=body)


def decisions(client: TestClient) -> list[dict]:
    response = client.get("/fleet/decisions", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    return response.json()["decisions"]


def post(client: TestClient, **fields) -> httpx.Response:
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1, **fields}
    return client.post("/v1/completions", json=body)


# ---------------------------------------------------------------------- prompts over every limit
class CountingTokenizer:
    """The built-in tokenizer, counting the bytes it was asked to encode."""

    def __init__(self) -> None:
        self.inner = load_tokenizer(None)
        self.num_bytes = 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def encode(self, text: str) -> list[int]:
        self.num_bytes += len(text.encode())
        return self.inner.encode(text)

    def chat_prompt(self, messages):
        self.num_bytes += sum(len(m["content"].encode()) for m in messages)
        return self.inner.chat_prompt(messages)


def test_a_prompt_over_every_engines_limit_is_refused_before_it_is_tokenized() -> None:
    """A 2 MB text prompt (completion or chat) against engines that take 4,096 tokens is
    refused 400 `too_long` from its length alone, the text never tokenized (issue 47, item
    10); a prompt within the limit is tokenized and sent."""
    tokenizer = CountingTokenizer()
    client = httpx.AsyncClient(transport=httpx.MockTransport(completion))
    fleet = Fleet([up_engine(URLS[0], max_request_tokens=4096)], make_policy("hybrid"))
    app = create_app(fleet, tokenizer, (TOKEN,), client=client)  # type: ignore[arg-type]
    text = "x" * (2 << 20)
    with TestClient(app) as test_client:
        over = post(test_client, prompt=text)
        chat = test_client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": text}]},
        )
        for answer in (over, chat):
            assert answer.status_code == 400
            error = answer.json()["error"]
            assert error["code"] == "too_long" and "at least" in error["message"]
        assert tokenizer.num_bytes == 0
        within = post(test_client, prompt="a short prompt")
        assert within.status_code == 200, within.text
        assert tokenizer.num_bytes == len("a short prompt")


# ---------------------------------------------------------------------- failover
def test_a_body_over_max_body_bytes_is_refused_before_it_is_held() -> None:
    """The router bounds a body as the engine does (`--max-body-bytes`, its own flag now,
    not a constant): 413 `request_too_large` naming the setting, nothing sent to an engine,
    for a declared length and for a chunked body alike."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return completion(request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    fleet = Fleet([up_engine(URLS[0])], make_policy("hybrid"))
    app = create_app(fleet, load_tokenizer(None), (TOKEN,), client=client, max_body_bytes=4096)
    with TestClient(app) as test_client:
        chunked = test_client.post(
            "/v1/completions",
            content=iter([b'{"model": "m", "prompt": [', b"1, " * 2000, b"1]}"]),
            headers={"content-type": "application/json"},
        )
        for refused in (post(test_client, prompt=list(range(2000))), chunked):
            assert refused.status_code == 413, refused.text
            error = refused.json()["error"]
            assert error["code"] == "request_too_large" and "--max-body-bytes" in error["message"]
        assert seen == []
        assert post(test_client).status_code == 200 and len(seen) == 1


def test_a_refused_connection_fails_over_and_is_recorded() -> None:
    """The first engine tried refuses the connection (its feed still speaks): the request was
    never sent there, so the other engine answers it, and the decision names the refuser."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"http://{request.url.host}")
        if len(calls) == 1:
            raise httpx.ConnectError("connection refused", request=request)
        return completion(request)

    engines = [up_engine(url) for url in URLS]
    with router(engines, handler) as client:
        response = post(client)
        assert response.status_code == 200, response.text
        refuser, answerer = calls
        assert refuser != answerer
        assert response.headers["X-Junction-Engine"] == answerer
        assert response.json()["choices"][0]["text"] == "x"
        (decision,) = [d for d in decisions(client) if d["url"] == answerer]
        assert decision["failed_over_from"] == [refuser]
        assert decision["status"] == "finished"
        down = {e.url: e.status for e in engines}
        assert down == {refuser: "down", answerer: "up"}


def test_every_engine_refusing_answers_503_naming_them() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"http://{request.url.host}")
        raise httpx.ConnectError("connection refused", request=request)

    with router([up_engine(url) for url in URLS], handler) as client:
        response = post(client)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "no_engine" and "was not sent" in error["message"]
    assert sorted(calls) == URLS and all(url in error["message"] for url in URLS)


class BrokenBody(httpx.AsyncByteStream):
    """An answer's body that breaks after its first bytes."""

    async def __aiter__(self):
        yield b'{"id": "cmpl-'
        raise httpx.ReadError("connection reset")


def test_a_request_that_failed_after_it_was_sent_is_never_sent_again() -> None:
    """The engine began its answer and then broke: it may have run the request, so the router
    answers 502 `engine_failed` and sends it nowhere else, though the other engine is up."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"http://{request.url.host}")
        return httpx.Response(200, stream=BrokenBody())

    with router([up_engine(url) for url in URLS], handler) as client:
        response = post(client)
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["code"] == "engine_failed" and "not retried" in error["message"]
        assert len(calls) == 1  # one request at the engines
        (decision,) = decisions(client)
        assert decision["status"] == "failed" and decision["failed_over_from"] == []
        assert decision["url"] == calls[0] and calls[0] in error["message"]


def test_a_connection_closed_without_a_byte_of_an_answer_fails_over() -> None:
    """An engine that closes the connection before any byte of an answer (a pooled
    connection to a killed engine, a port that does not serve OpenAI) never took the request:
    it goes to the other engine, and the first is taken out (issue 47, item 12)."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"http://{request.url.host}")
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("server disconnected without a response")
        return completion(request)

    with router([up_engine(url) for url in URLS], handler) as client:
        response = post(client)
        assert response.status_code == 200, response.text
        assert len(calls) == 2 and calls[0] != calls[1]
        served = [d for d in decisions(client) if d["url"] == calls[1]]
        assert [d["failed_over_from"] for d in served] == [[calls[0]]]


# ---------------------------------------------------------------------- max_request_tokens
def test_an_engine_takes_a_request_of_exactly_its_max_request_tokens() -> None:
    """The request holds prompt + max_tokens tokens: equal to the engine's `max_request_tokens`
    it is sent there; one over, it is refused 400 `too_long` and sent nowhere."""
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return completion(request)

    with router([up_engine(URLS[0], max_request_tokens=10)], handler) as client:
        fits = post(client, prompt=[1, 2, 3, 4], max_tokens=6)
        assert fits.status_code == 200, fits.text
        assert len(calls) == 1
        over = post(client, prompt=[1, 2, 3, 4], max_tokens=7)
        assert over.status_code == 400
        error = over.json()["error"]
        assert error["code"] == "too_long" and "11 prompt + output tokens" in error["message"]
        assert len(calls) == 1


def test_a_request_over_the_small_engines_limit_goes_to_the_big_one_at_its_limit() -> None:
    """Two engines, limits 10 and 12: a request of 12 goes to the big one only; one of 10
    may go to either (the small one takes its limit), and none of 13 is sent."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"http://{request.url.host}")
        return completion(request)

    small, big = up_engine(URLS[0], 10), up_engine(URLS[1], 12)
    big.load = FeedLoad(0, 0, 1000, 0.0, 0.0)  # busy: the small one wins whatever it takes
    with router([small, big], handler) as client:
        assert post(client, prompt=[1, 2], max_tokens=8).status_code == 200
        assert post(client, prompt=[1, 2], max_tokens=10).status_code == 200
        assert post(client, prompt=[1, 2], max_tokens=11).status_code == 400
    assert calls == [small.url, big.url]


# ---------------------------------------------------------------------- streamed usage
def stream_handler(seen: list[dict]) -> Handler:
    """An engine that streams two content chunks, then its usage chunk (empty `choices`)."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        chunks = [
            {"id": "cmpl-1", "choices": [{"index": 0, "text": "a", "finish_reason": None}]},
            {"id": "cmpl-1", "choices": [{"index": 0, "text": "b", "finish_reason": "length"}]},
            {
                "id": "cmpl-1",
                "choices": [],
                "usage": {
                    "prompt_tokens": 3,
                    "completion_tokens": 2,
                    "total_tokens": 5,
                    "prompt_tokens_details": {"cached_tokens": 0},
                },
            },
        ]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    return handler


def events(response: httpx.Response) -> list[dict]:
    payloads = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def test_a_stream_carries_the_usage_chunk_only_when_the_client_asked() -> None:
    seen: list[dict] = []
    with router([up_engine(URLS[0])], stream_handler(seen)) as client:
        plain = events(post(client, stream=True, max_tokens=2))
        asked = events(
            post(client, stream=True, max_tokens=2, stream_options={"include_usage": True})
        )
        finished = [(d["status"], d["realised_hit"]) for d in decisions(client)]
    # a client that indexes choices[0] on every chunk must not break
    assert [c["choices"][0]["text"] for c in plain] == ["a", "b"]
    assert "usage" not in json.dumps(plain)
    assert [c["choices"] for c in asked][-1] == []
    assert asked[-1]["usage"]["completion_tokens"] == 2
    assert [c["choices"][0]["text"] for c in asked[:-1]] == ["a", "b"]
    # the router asks the engine for usage either way (its realised hit), and records it
    assert all(body["stream_options"] == {"include_usage": True} for body in seen)
    assert finished == [("finished", 0), ("finished", 0)]
