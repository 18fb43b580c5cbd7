"""Privacy of miss attribution: nothing the store keeps or serves lets a reader recover a
prompt's tokens or the engine's unit hashes.

A ledger engine streams, through its publisher, to `junction api` on PostgreSQL, a family of
requests whose shared prefix holds a planted secret run of token ids. Then every column of
every table and every REST response for the engine (requests, attribution, events, blocks) is
searched for any 4 consecutive secret tokens (as a JSON integer list, as text, as
little-endian uint32 bytes) and for the raw unit hashes the engine sent (a unit alone, or two
consecutive units as the wire's chain holds them). The store's own block keys are the
engine's cache keys (full 16-byte hashes): a unit hash is their first half, which is why a
unit only counts standing alone. `requests.junction_token_ids` is left out of the table
search on purpose: it keeps the tokens of a junction for the suggested junctions' pin
requests, and the test checks that no read of a request or an event serves it.
"""

from __future__ import annotations

import json
import random
import re
import struct
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from api.attribution import unit_salt
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import UNIT_HASH_BYTES
from engine.request import SamplingParams
from publish.publisher import EventPublisher
from tests.api.conftest import api_on_postgres
from tests.api.processes import AUTH, TOKEN, ApiProcess
from tests.polling import wait_for

RUN = 4  # the shortest run of secret tokens that must not appear
# letters no hex string holds, in both cases: a window of them cannot match a hash by chance
LETTERS = "ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ"
ALLOWED = {("requests", "junction_token_ids")}  # the suggested junctions' (module docstring)


@pytest.fixture(scope="module")
def api(postgres) -> Iterator[ApiProcess]:
    with api_on_postgres(postgres, "junction_privacy") as process:
        yield process


def test_no_secret_token_run_nor_raw_unit_hash_is_stored_or_served(api):
    rng = random.Random(7)
    secret = [ord(rng.choice(LETTERS)) for _ in range(64)]
    system = (
        [rng.randrange(256) for _ in range(200)] + secret + [rng.randrange(256) for _ in range(300)]
    )
    engine = Engine(CacheConfig(), SchedulerConfig(), runner="ledger", engine_id="private")
    chains: list[str] = []
    engine.step_listeners.append(  # ahead of the publisher's listener: it sees every event
        lambda e: chains.extend(
            ev.unit_hashes for ev in e.sink.events if getattr(ev, "unit_hashes", "")
        )
    )
    with EventPublisher(api.url, TOKEN) as publisher:
        publisher.attach(engine)
        engine.pin("system", system[:560])
        engine.run_until_done()
        for _ in range(4):
            question = [rng.randrange(256) for _ in range(40)]
            engine.add_request(system + question, SamplingParams(max_tokens=8))
        engine.run_until_done()
        engine.add_request(system + secret, SamplingParams(max_tokens=8))  # a resend-like one
        engine.run_until_done()
        assert publisher.flush(60), publisher.stats()
    chains = [chain for chain in chains if chain]
    assert chains, "the engine sent no unit hashes"
    base = f"{api.url}/api/v1/engines/private"
    wait_for(
        "every request attributed",
        lambda: httpx.get(f"{base}/attribution", headers=AUTH).json()["total"]["num_requests"] == 5,
    )
    served = dump_rest(base, api.url)
    stored = dump_tables(api.database_url)
    units = [c[i : i + 2 * UNIT_HASH_BYTES] for c in chains for i in range(0, len(c), 16)]
    pairs = [c[i : i + 4 * UNIT_HASH_BYTES] for c in chains for i in range(0, len(c) - 16, 16)]
    windows = [secret[i : i + RUN] for i in range(len(secret) - RUN + 1)]
    leaks = [
        f"{where}: {what}"
        for where, value in [*served, *stored]
        for what in leaks_in(value, windows, units, pairs)
    ]
    assert not leaks, leaks[:10]
    # the store does keep attribution's units, salted: none is a raw hash read as an integer
    raw = {int.from_bytes(bytes.fromhex(unit), signed=True) for unit in units}
    salted = {value for where, value in stored if where.startswith("shared_units.hash")}
    assert salted and not (salted & raw)
    # and so do the what-if's request chains: the same salted units, never the raw ones
    kept = [bytes(v) for where, v in stored if where == "request_chains.units"]
    chained = {unit for value in kept for unit in unit_salt.unpack(value)}
    assert chained and chained <= salted and not (chained & raw)


def dump_rest(base: str, root: str) -> list[tuple[str, str | bytes]]:
    """Every REST response for the engine, as its text."""
    urls = [base, f"{base}/requests?limit=1000", f"{base}/attribution", f"{base}/hit-rate"]
    urls += [f"{base}/blocks?limit=10000", f"{root}/api/v1/events?engine_id=private&limit=1000"]
    page = httpx.get(urls[1], headers=AUTH).json()["requests"]
    assert all("junction_token_ids" not in r and "unit_hashes" not in r for r in page)
    urls += [f"{base}/requests/{r['request_id']}" for r in page]
    return [(url, httpx.get(url, headers=AUTH, timeout=10).text) for url in urls]


def dump_tables(database_url: str) -> list[tuple[str, object]]:
    """Every value of every column of every table, named `table.column`."""
    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    values = []
    with psycopg.connect(url) as connection:
        tables = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        for (table,) in tables:
            cursor = connection.execute(f'SELECT * FROM "{table}"')
            names = [column.name for column in cursor.description]
            for row in cursor:
                values += [
                    (f"{table}.{name}", value)
                    for name, value in zip(names, row, strict=True)
                    if (table, name) not in ALLOWED
                ]
    return values


def leaks_in(value: object, windows: list[list[int]], units: list[str], pairs: list[str]):
    """What of the secret or the raw hashes `value` shows."""
    if isinstance(value, memoryview):
        value = bytes(value)
    if isinstance(value, bytes):
        for window in windows:
            if bytes(window) in value or struct.pack(f"<{RUN}I", *window) in value:
                yield f"secret bytes {window}"
        value = value.hex()
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    for window in windows:
        if bytes(window).decode() in text:
            yield f"secret text {bytes(window).decode()!r}"
        if re.search(r"\b" + r"\s*,\s*".join(map(str, window)) + r"\b", text):
            yield f"secret token ids {window}"
    for unit in units:
        if unit in text and re.search(f"(?<![0-9a-f]){unit}(?![0-9a-f])", text):
            yield f"raw unit hash {unit}"
    for pair in pairs:
        if pair in text:
            yield f"raw unit hashes {pair}"
