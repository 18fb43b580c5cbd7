"""The control plane's limits (`api.guards.limits`, `protocol.connections.header_timeout`,
`api.guards.json_body`, the 422
handler of `api.guards.errors`): big, slow and malformed requests are refused with a 4xx, early and
cheaply, never with a 500 or by reading what they send.

The timing and memory checks run `junction api` in its own process on PostgreSQL, over raw
sockets (a client that sends less than it announces, or trickles it); the bad values run on
both backends through the app.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Annotated

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import AfterValidator
from sqlalchemy.orm import Session
from starlette.requests import Request

from api.guards.json_body import JsonBody
from api.main import create_app
from api.settings import Settings
from engine.engine import Engine
from tests.api import factories
from tests.api.conftest import TOKEN, Postgres, api_on_postgres
from tests.api.processes import TOKEN as PROCESS_TOKEN
from tests.api.processes import ApiProcess

V1 = "/api/v1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "Content-Type": "application/json"}
PROCESS_AUTH = {"Authorization": f"Bearer {PROCESS_TOKEN}"}
MB = 1 << 20
BODY_TIMEOUT_S = 1.0
HEADER_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 64
SHORT_TEXT = "a system prompt that is long enough to pin"


# ---------------------------------------------------------------------------- a real server
@pytest.fixture
def limited_api(postgres: Postgres, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiProcess]:
    """`junction api` in a subprocess on PostgreSQL, with 1 s timeouts and 64 connections."""
    monkeypatch.setenv("JUNCTION_BODY_TIMEOUT_S", str(BODY_TIMEOUT_S))
    monkeypatch.setenv("JUNCTION_HEADER_TIMEOUT_S", str(HEADER_TIMEOUT_S))
    monkeypatch.setenv("JUNCTION_MAX_CONNECTIONS", str(MAX_CONNECTIONS))
    with api_on_postgres(postgres, "junction_limits") as process:
        yield process


def head(
    method: str, path: str, *, length: int | None = None, token: str | None = PROCESS_TOKEN
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines.append("Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """The status and body of the one response on `sock` (read by its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a response: {data!r}"
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(fields.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed inside the response body"
        body += chunk
    return int(lines[0].split()[1]), body


def rest(sock: socket.socket, timeout_s: float = 5) -> bytes:
    """What the server still sends on `sock` before it closes it (within `timeout_s`)."""
    sock.settimeout(timeout_s)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open ({received[:100]!r})") from None
    return received


def rss_mb(process: ApiProcess) -> float:
    with open(f"/proc/{process.process.pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_a_50_mb_body_is_refused_before_it_is_read(limited_api: ApiProcess) -> None:
    """The issue's case: four clients sending 50 MB bodies. Each is answered 413 from its
    headers at once, the connection closed; the server's memory does not grow with them."""
    before = rss_mb(limited_api)
    results: list[tuple[int, bytes, float, bytes]] = []

    def announce_50_mb() -> None:
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", limited_api.port), timeout=10) as sock:
                start = time.monotonic()
                sock.sendall(head("POST", f"{V1}/pins", length=50 * MB) + b'{"prefix"')
                status, body = read_response(sock)
                results.append((status, body, time.monotonic() - start, rest(sock)))

    def send_50_mb() -> None:  # the whole body, as the tester's clients did
        with socket.create_connection(("127.0.0.1", limited_api.port), timeout=10) as sock:
            sock.sendall(head("POST", f"{V1}/pins", length=50 * MB))
            try:
                for _ in range(50):
                    sock.sendall(b"0" * MB)
            except OSError:  # the server answered and closed: the rest is not read
                pass

    threads = [threading.Thread(target=f) for f in [announce_50_mb] * 4 + [send_50_mb] * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 20
    for status, body, _, after in results:
        assert (status, after) == (413, b"")  # and closed
        assert "at most 16777216 (JUNCTION_MAX_PIN_BODY_BYTES)" in json.loads(body)["detail"]
    grown = rss_mb(limited_api) - before
    print(
        f"RSS {before:.0f} MB before, grew {grown:.1f} MB; slowest 413 in "
        f"{max(r[2] for r in results) * 1000:.1f} ms"
    )
    assert grown < 100
    assert httpx.get(f"{limited_api.url}/healthz", timeout=5).status_code == 200


def test_a_write_without_a_valid_token_is_refused_before_its_body(
    limited_api: ApiProcess,
) -> None:
    """10 MB announced (under the pin limit), 9 bytes sent: no token is answered by the
    middleware, a wrong one by the token dependency, which runs before the body is read."""
    for token, detail in ((None, "missing bearer token"), ("wrong-token", "wrong bearer token")):
        with socket.create_connection(("127.0.0.1", limited_api.port), timeout=5) as sock:
            sock.sendall(head("POST", f"{V1}/pins", length=10 * MB, token=token) + b'{"prefix"')
            status, body = read_response(sock)
            # a server that waited for the body would have answered 408 (its timeout) instead
            assert (status, json.loads(body)["detail"][: len(detail)]) == (401, detail)
            assert rest(sock) == b""


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_slow_body_is_cut_by_the_body_timeout(limited_api: ApiProcess, chunked: bool) -> None:
    """The body stops coming: the server answers 408 naming the setting and closes (within
    the socket's 10 s: a server without the timeout would wait for good)."""
    with socket.create_connection(("127.0.0.1", limited_api.port), timeout=10) as sock:
        if chunked:
            sock.sendall(head("POST", f"{V1}/pins", length=None) + b'9\r\n{"prefix"\r\n')
        else:
            sock.sendall(head("POST", f"{V1}/pins", length=100) + b'{"prefix"')
        status, body = read_response(sock)
        assert status == 408
        assert "(JUNCTION_BODY_TIMEOUT_S)" in json.loads(body)["detail"]
        assert rest(sock) == b""


def test_slow_headers_are_cut_by_the_header_timeout(limited_api: ApiProcess) -> None:
    """A connection that sends nothing, one that trickles its headers a byte at a time, and a
    keep-alive one that trickles its second request's: each is answered 408 and closed."""
    address = ("127.0.0.1", limited_api.port)

    def trickle(sock: socket.socket, text: bytes) -> int:
        """The bytes of `text` sent, a byte every 0.1 s, before the server answered 408 and
        closed `sock` (sending stops once the answer is there)."""
        sent = 0
        for byte in text:
            if select.select([sock], [], [], 0.1)[0]:
                break
            sock.sendall(bytes([byte]))
            sent += 1
        assert rest(sock, HEADER_TIMEOUT_S + 3).startswith(b"HTTP/1.1 408 ")
        return sent

    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"z" * 100
    with socket.create_connection(address) as idle:
        assert trickle(idle, b"") == 0  # nothing sent: answered 408 all the same
    with socket.create_connection(address) as slow:  # cut before its headers were done
        assert trickle(slow, request) < len(request)
    with socket.create_connection(address) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_response(kept)[0] == 200
        assert trickle(kept, request) < len(request)


def test_a_head_over_the_header_limit_is_400(limited_api: ApiProcess) -> None:
    with socket.create_connection(("127.0.0.1", limited_api.port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"z" * 20_000)
        assert rest(sock).startswith(b"HTTP/1.1 400 ")


def test_idle_connections_over_the_cap_give_way_to_a_request(limited_api: ApiProcess) -> None:
    """More idle sockets than JUNCTION_MAX_CONNECTIONS: a request still gets in (idle ones
    are closed 503 to make room, `tests/api/test_idle_connections.py` has the rest); every
    idle one is closed, the last ones by the header timeout."""
    idle = [
        socket.create_connection(("127.0.0.1", limited_api.port))
        for _ in range(MAX_CONNECTIONS + 8)
    ]
    try:
        assert httpx.get(f"{limited_api.url}/healthz", timeout=5).status_code == 200
        answers = [rest(sock, HEADER_TIMEOUT_S + 3) for sock in idle]
        assert sum(answer.startswith(b"HTTP/1.1 503 ") for answer in answers) >= 8
        assert all(answer.startswith((b"HTTP/1.1 503 ", b"HTTP/1.1 408 ")) for answer in answers)
    finally:
        for sock in idle:
            sock.close()


def test_healthz_answers_while_a_large_pin_body_is_validated(limited_api: ApiProcess) -> None:
    """A pin of 2^20 token ids (4.6 MB) and a 15 MB one of 8M ids are answered (201, 422)
    with short answers, and every /healthz made meanwhile is answered 200, some of them
    before the pin's answer. How long each took is not asserted (a shared machine decides
    that): that the body is parsed off the event loop is the next test's."""
    valid = json.dumps({"prefix": {"token_ids": list(range(256)) * 4096}, "label": "big"})
    invalid = '{"prefix": {"token_ids": [' + ",".join(["0"] * 8_000_000) + ']}, "label": "x"}'
    for body, status in ((valid, 201), (invalid, 422)):
        answer, num_answered = post_while_polling_healthz(limited_api, body)
        assert answer.status_code == status, answer.text[:300]
        assert len(answer.content) < 10_000
        assert num_answered >= 1


def test_a_json_body_is_decoded_and_validated_off_the_event_loop() -> None:
    """`JsonBody` parses in a worker thread: the event loop's thread never runs the decode
    or the validation of a body (which take the GIL for up to 0.4 s on a 16 MiB one)."""
    threads: dict[str, int] = {}

    def validated(value: list[int]) -> list[int]:
        threads["validation"] = threading.get_ident()
        return value

    body = JsonBody(Annotated[list[int], AfterValidator(validated)])

    async def parse(raw: bytes) -> list[int]:
        threads["loop"] = threading.get_ident()

        async def receive() -> dict:
            return {"type": "http.request", "body": raw, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/", "headers": JSON_HEADERS}
        return await body(Request(scope, receive))

    assert asyncio.run(parse(b"[1, 2, 3]")) == [1, 2, 3]
    assert threads["validation"] != threads["loop"]


JSON_HEADERS = [(b"content-type", b"application/json")]


def post_while_polling_healthz(api: ApiProcess, body: str) -> tuple[httpx.Response, int]:
    """The answer to the pin `body`, and how many /healthz calls made meanwhile were
    answered (each must be a 200) before it."""
    answers: list[httpx.Response] = []
    headers = {"Content-Type": "application/json", **PROCESS_AUTH}
    poster = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{api.url}{V1}/pins", content=body, headers=headers, timeout=60)
        )
    )
    num_answered = 0
    with httpx.Client(base_url=api.url) as client:
        assert client.get("/healthz").status_code == 200  # connected before the post
        poster.start()
        while poster.is_alive():
            assert client.get("/healthz", timeout=30).status_code == 200
            num_answered += poster.is_alive()
            time.sleep(0.01)
    poster.join()
    return answers[0], num_answered


# ---------------------------------------------------------------------------- bad values
@pytest.fixture
def ingested(session: Session, engine_run: Engine) -> str:
    """The base path of an engine whose events the store holds."""
    factories.ingest(session, engine_run)
    return f"{V1}/engines/{engine_run.engine_id}"


PIN = b'{"prefix": {"text": "abcdefghijklmnopq"}, "label": "x"'  # then `, ...}` or `}`
BAD_BODIES = {
    # name: (route, raw body, the error's loc)
    "an infinite float": ("pins", b"1e999999", ["body"]),
    "NaN": ("pins", b"NaN", ["body"]),
    "-Infinity in a field": ("pins", PIN + b', "priority": -Infinity}', ["body"]),
    "an infinite priority": ("pins", PIN + b', "priority": 1e999}', ["body"]),
    "a lone surrogate in the label": (
        "pins",
        b'{"prefix": {"text": "x"}, "label": "\\ud800"}',
        ["body", "label"],
    ),
    "a lone low surrogate in the text": (
        "pins",
        b'{"prefix": {"text": "ab\\udc00"}, "label": "x"}',
        ["body", "prefix", "text"],
    ),
    "a surrogate's raw bytes": (
        "pins",
        b'{"prefix": {"text": "\xed\xa0\x80"}, "label": "x"}',
        ["body", "prefix", "text"],
    ),
    "a surrogate in a message": (
        "pins",
        b'{"prefix": {"messages": [{"role": "system", "content": "\\ud83d"}]}, "label": "x"}',
        ["body", "prefix", "messages", 0, "content"],
    ),
    "a NUL in the label": (
        "pins",
        b'{"prefix": {"text": "x"}, "label": "a\\u0000b"}',
        ["body", "label"],
    ),
    "a NUL in a key": ("pins", PIN + b', "a\\u0000": 1}', ["body"]),
    "a NUL in a spec": (
        "benchmarks",
        b'{"name": "gsp\\u0000", "workload": {"kind": "generated_shared_prefix"}}',
        ["body", "name"],
    ),
    "a surrogate in a spec": ("benchmarks", b'{"name": "\\udfff"}', ["body", "name"]),
    "NaN in a spec": ("benchmarks", b'{"name": "x", "concurrency": NaN}', ["body"]),
    "a 5000-digit integer": ("benchmarks", b'{"seed": ' + b"9" * 5000 + b"}", ["body"]),
    "nested too deep": ("benchmarks", b"[" * 100_000, ["body"]),
}


@pytest.mark.parametrize("case", list(BAD_BODIES), ids=list(BAD_BODIES))
def test_bad_body_values_are_422_naming_the_field(client: TestClient, case: str) -> None:
    route, raw, loc = BAD_BODIES[case]
    response = client.post(f"{V1}/{route}", content=raw, headers=JSON)
    assert response.status_code == 422, response.text
    assert loc in [error["loc"] for error in response.json()["detail"]], response.text
    assert client.get(f"{V1}/{route}", headers=AUTH).json() == NOTHING[route]


NOTHING = {"pins": [], "benchmarks": {"total": 0, "offset": 0, "limit": 50, "runs": []}}
TOO_BIG = str(2**63)
EVENTS, PINS, JUNCTIONS, BENCHMARKS = (
    f"{V1}/events",
    f"{V1}/pins",
    f"{V1}/junctions/suggested",
    f"{V1}/benchmarks",
)
BAD_PARAMETERS = {
    # name: (path under the engine's base, or from /api/v1; query; the error's loc)
    "a NUL in the engine id": (f"{V1}/engines/e%00", {}, ["path", "engine_id"]),
    "a NUL in a request id": ("/requests/r%00", {}, ["path", "request_id"]),
    "a NUL in a pin id": (f"{PINS}/pin-%00", {}, ["path", "pin_id"]),
    "a NUL in events' engine_id": (EVENTS, {"engine_id": "e\x00"}, ["query", "engine_id"]),
    "a NUL in pins' engine_id": (PINS, {"engine_id": "\x00"}, ["query", "engine_id"]),
    "a NUL in junctions' engine_id": (JUNCTIONS, {"engine_id": "\x00"}, ["query", "engine_id"]),
    "a grid start of 2^63": ("/blocks/grid", {"start": TOO_BIG}, ["query", "start"]),
    "a grid stop of 2^63": ("/blocks/grid", {"stop": TOO_BIG}, ["query", "stop"]),
    "a grid start of 2^31 (block ids are 32-bit)": (
        "/blocks/grid",
        {"start": str(2**31)},
        ["query", "start"],
    ),
    "a grid max_cells of 2^63": ("/blocks/grid", {"max_cells": TOO_BIG}, ["query", "max_cells"]),
    "a blocks offset of 2^63": ("/blocks", {"offset": TOO_BIG}, ["query", "offset"]),
    "a requests offset of 2^63": ("/requests", {"offset": TOO_BIG}, ["query", "offset"]),
    "an events epoch of 2^63": (EVENTS, {"epoch": TOO_BIG}, ["query", "epoch"]),
    "an events after_seq of 2^63": (EVENTS, {"after_seq": TOO_BIG}, ["query", "after_seq"]),
    "a benchmarks offset of 2^63": (BENCHMARKS, {"offset": TOO_BIG}, ["query", "offset"]),
    "a run id of 2^63": (f"{BENCHMARKS}/{TOO_BIG}", {}, ["path", "run_id"]),
    "an infinite since": ("/hit-rate", {"since": "inf"}, ["query", "since"]),
    "a NaN until": ("/hit-rate", {"until": "nan"}, ["query", "until"]),
}


@pytest.mark.parametrize("case", list(BAD_PARAMETERS), ids=list(BAD_PARAMETERS))
def test_bad_parameters_are_422_naming_them(client: TestClient, ingested: str, case: str) -> None:
    path, query, loc = BAD_PARAMETERS[case]
    url = path if path.startswith(V1) else ingested + path
    response = client.get(url, params=query, headers=AUTH)
    assert response.status_code == 422, response.text
    assert loc in [error["loc"] for error in response.json()["detail"]], response.text


def test_the_largest_int64_is_not_an_error(client: TestClient, ingested: str) -> None:
    largest, block_id = str(2**63 - 1), str(2**31 - 1)
    for url, query in (
        (f"{ingested}/blocks/grid", {"start": block_id, "stop": block_id, "max_cells": largest}),
        (f"{ingested}/blocks/grid", {"stop": block_id, "max_cells": 10}),
        (f"{ingested}/blocks", {"offset": largest}),
        (f"{V1}/events", {"epoch": largest, "engine_id": ingested.rsplit("/", 1)[1]}),
        (f"{V1}/benchmarks/{largest}", {}),
    ):
        assert client.get(url, params=query, headers=AUTH).status_code in (200, 404)


def test_a_422_does_not_echo_a_huge_input(client: TestClient) -> None:
    """3M token ids (6 MB): one short error, its input a preview; 100,000 bad modes of a
    benchmark: the first 20 errors and a count of the rest."""
    ids = b",".join([b"7"] * 3_000_000)
    raw = b'{"prefix": {"token_ids": [' + ids + b']}, "label": "x"}'
    response = client.post(f"{V1}/pins", content=raw, headers=JSON)
    assert response.status_code == 422 and len(response.content) < 10_000
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "prefix", "token_ids"] and error["type"] == "too_long"
    assert error["input"] == "[7, 7, 7, 7, 7, 7, 7, 7, ...] (3000000 items)"
    body = {"prefix": {"text": "x"}, "label": "y" * 50_000}
    long_label = client.post(f"{V1}/pins", json=body, headers=AUTH)
    assert long_label.status_code == 422 and len(long_label.content) < 10_000
    modes = client.post(f"{V1}/benchmarks", json={"modes": ["warp"] * 100_000}, headers=AUTH)
    assert modes.status_code == 422 and len(modes.content) < 10_000
    detail = modes.json()["detail"]
    assert len(detail) == 21 and detail[-1]["type"] == "too_many_errors"


@pytest.mark.parametrize(
    ("route", "setting"),
    [("pins", "JUNCTION_MAX_PIN_BODY_BYTES"), ("benchmarks", "JUNCTION_MAX_BODY_BYTES")],
)
def test_a_chunked_body_over_the_limit_is_413(
    client: TestClient, settings: Settings, route: str, setting: str
) -> None:
    limit = settings.max_pin_body_bytes if route == "pins" else settings.max_body_bytes
    chunks = iter([b" " * MB] * (limit // MB + 2))  # no Content-Length: streamed, counted
    response = client.post(f"{V1}/{route}", content=chunks, headers=JSON)
    assert response.status_code == 413
    assert response.json()["detail"].endswith(f"at most {limit} ({setting})")


def test_chunks_over_the_limit_on_a_raw_socket_are_413(limited_api: ApiProcess) -> None:
    """Real chunked transfer-encoding, no Content-Length: the server counts the chunks as they
    come and answers 413 once they pass JUNCTION_MAX_PIN_BODY_BYTES, then closes; what the
    client still sends is not read."""
    chunk = b" " * MB
    framed = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    with socket.create_connection(("127.0.0.1", limited_api.port), timeout=10) as sock:
        sock.sendall(head("POST", f"{V1}/pins", length=None) + b'4\r\n{"a"\r\n')
        try:
            for _ in range(16 + 4):  # 16 MiB is the limit
                sock.sendall(framed)
        except OSError:  # answered and closed before the last chunks
            pass
        status, body = read_response(sock)
        assert status == 413
        assert "at most 16777216 (JUNCTION_MAX_PIN_BODY_BYTES)" in json.loads(body)["detail"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_at_the_limit_is_taken_and_one_byte_more_is_413(
    settings: Settings, chunked: bool
) -> None:
    small = settings.model_copy(update={"max_pin_body_bytes": 1000})
    body = json.dumps({"prefix": {"text": SHORT_TEXT}, "label": "edge"}).encode()
    at_limit = body + b" " * (1000 - len(body))  # trailing whitespace is valid JSON
    with TestClient(create_app(small)) as client:
        for raw, status in ((at_limit, 201), (at_limit + b" ", 413)):
            content = iter([raw[:500], raw[500:]]) if chunked else raw
            response = client.post(f"{V1}/pins", content=content, headers=JSON)
            assert response.status_code == status, (len(raw), response.text)


def test_the_limits_are_settings(settings: Settings) -> None:
    small = settings.model_copy(update={"max_pin_body_bytes": 1000, "max_body_bytes": 100})
    with TestClient(create_app(small)) as client:
        body = {"prefix": {"text": "x" * 2000}, "label": "x"}
        response = client.post(f"{V1}/pins", json=body, headers=AUTH)
        assert response.status_code == 413
        assert response.json()["detail"].endswith("at most 1000 (JUNCTION_MAX_PIN_BODY_BYTES)")
        body = {"prefix": {"text": SHORT_TEXT}, "label": "x"}
        assert client.post(f"{V1}/pins", json=body, headers=AUTH).status_code == 201
        spec = client.post(f"{V1}/benchmarks", json={"name": "x" * 200}, headers=AUTH)
        assert spec.status_code == 413 and "(JUNCTION_MAX_BODY_BYTES)" in spec.text
