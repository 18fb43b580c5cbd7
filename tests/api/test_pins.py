"""Pins and suggested junctions through the REST API, with ledger engines behind the real
ingest socket answering the control plane's commands as `junction serve` does."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import msgspec
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.store.models import Request
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.model.tokenizer import ByteTokenizer
from engine.traces.trace import segment_tokens
from engine.wire import Command, encode
from publish.commands import apply_command
from tests.api import factories
from tests.api.conftest import TOKEN
from tests.polling import wait_until

V1 = "/api/v1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SYSTEM = ("You are the Junction test assistant. Answer in one short sentence. " * 3)[:200]


def ledger(engine_id: str, max_model_len: int = 1 << 20, **cache) -> Engine:
    config = {"block_size": 16, "mamba_block_size": 512, "num_blocks": 512} | cache
    return Engine(
        CacheConfig(**config),
        SchedulerConfig(max_model_len=max_model_len),
        runner="ledger",
        engine_id=engine_id,
    )


class WireEngine:
    """A ledger engine on the ingest socket: it says hello with its geometry, applies the
    commands it is sent with the engine's own `apply_command`, and streams its events."""

    def __init__(self, client: TestClient, engine: Engine) -> None:
        self.client = client
        self.engine = engine
        self.seq = 0
        self.num_sent = 0
        self.received: list[dict] = []  # every command, in order
        self.ws = None
        self._session = None

    @property
    def engine_id(self) -> str:
        return self.engine.engine_id

    def connect(self) -> dict:
        self._session = self.client.websocket_connect(f"{V1}/ingest", headers=AUTH)
        self.ws = self._session.__enter__()
        self.ws.send_text(encode(factories.hello(self.engine)))
        welcome = self.ws.receive_json()
        assert welcome["type"] == "welcome"
        self.seq = welcome["next_seq"]
        return welcome

    def close(self) -> None:
        if self.ws is None:
            return
        self._session.__exit__(None, None, None)
        self.ws = None
        registry = self.client.app.state.junction.registry
        assert wait_until(lambda: self.engine_id not in registry)

    def send(self, events: list[dict]) -> list[dict]:
        """One batch; returns the commands that arrived before its ack."""
        frame = {
            "type": "batch",
            "engine_id": self.engine_id,
            "epoch": self.engine.epoch,
            "seq": self.seq,
            "ts": time.time(),
            "events": events,
        }
        self.ws.send_text(encode(frame))
        commands = []
        while (reply := self.ws.receive_json())["type"] != "ack":
            commands.append(reply)
        assert reply["seq"] == self.seq
        self.seq += 1
        self.received += commands
        return commands

    def sync(self) -> list[dict]:
        """Stream the events since the last batch (maybe none): what the control plane sent."""
        events = [event.to_dict() for event in self.engine.sink.events[self.num_sent :]]
        self.num_sent += len(events)
        return self.send(events)

    def serve(self) -> list[dict]:
        """Apply commands and stream events until the control plane has nothing more to say;
        then the store holds the engine's table."""
        applied = []
        while commands := self.sync():
            for command in commands:
                apply_command(self.engine, msgspec.convert(command, Command))
            self.engine.run_until_done()
            applied += commands
        self.check_table()
        return applied

    def check_table(self) -> None:
        """The blocks the REST API serves are the engine's table, both ways."""
        path = f"{V1}/engines/{self.engine_id}/blocks"
        page = self.client.get(path, params={"limit": 10_000}, headers=AUTH).json()
        factories.assert_same_table(factories.table(page["blocks"]), self.engine)

    def ask(self, prompt: list[int]) -> dict:
        """Run one request to the end and stream it; returns its `RequestFinished`."""
        request = self.engine.add_request(prompt)
        self.engine.run_until_done()
        self.serve()
        return next(
            event.to_dict()
            for event in reversed(self.engine.sink.events)
            if event.to_dict()["type"] == "RequestFinished"
            and event.to_dict()["request_id"] == request.request_id
        )


@pytest.fixture
def wire(client: TestClient) -> Iterator[Callable[[Engine], WireEngine]]:
    """Connects ledger engines to the app; closes them after the test."""
    opened: list[WireEngine] = []

    def connect(engine: Engine) -> WireEngine:
        engine_ = WireEngine(client, engine)
        engine_.connect()
        opened.append(engine_)
        return engine_

    yield connect
    for engine_ in opened:
        engine_.close()


def post_pin(client: TestClient, body: dict, status: int = 201) -> dict:
    response = client.post(f"{V1}/pins", json=body, headers=AUTH)
    assert response.status_code == status, response.text
    return response.json()


def get_pin(client: TestClient, pin_id: str, **params) -> dict:
    response = client.get(f"{V1}/pins/{pin_id}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def states(pin: dict) -> dict[str, str]:
    return {target["engine_id"]: target["state"] for target in pin["engines"]}


def pin_commands(received: list[dict]) -> list[tuple[str, str]]:
    return [(c["command"], c["payload"]["pin_id"]) for c in received]


# ---------------------------------------------------------------------------- the lifecycle
def test_create_list_show_release(client: TestClient, wire) -> None:
    fine = wire(ledger("fine"))
    coarse = wire(ledger("coarse", block_size=64, prefix_match_unit=64))
    created = post_pin(client, {"prefix": {"text": SYSTEM}, "label": "system prompt"})
    assert created["pin_id"].startswith("pin-")
    assert (created["num_tokens"], created["label"], created["priority"]) == (
        200,
        "system prompt",
        0,
    )
    assert created["boundary"] == {"coarse": 192, "fine": 192 // 16 * 16}
    assert (created["state"], created["targets"], created["origin"]) == ("pending", "all", "api")
    assert states(created) == {"coarse": "pending", "fine": "pending"}

    tokens = ByteTokenizer().encode(SYSTEM)
    for engine in (fine, coarse):
        (command,) = engine.serve()
        assert command == {
            "type": "command",
            "command": "pin",
            "payload": {
                "pin_id": created["pin_id"],
                "token_ids": tokens,
                "cache_salt": None,
                "text": SYSTEM,
            },
        }
    shown = get_pin(client, created["pin_id"])
    assert (shown["state"], states(shown)) == (
        "materialized",
        {"coarse": "materialized", "fine": "materialized"},
    )
    assert shown["token_ids"] is None and shown["num_tokens"] == len(tokens)
    assert get_pin(client, created["pin_id"], tokens="true")["token_ids"] == tokens
    for target in shown["engines"]:
        engine = {"fine": fine, "coarse": coarse}[target["engine_id"]].engine
        truth = engine.pins[created["pin_id"]].event().to_dict()
        assert target["boundary"] == truth["boundary"] == shown["boundary"][target["engine_id"]]
        assert (target["keys"], target["block_ids"]) == (truth["keys"], truth["block_ids"])
        assert target["reason"] is None
    listed = client.get(f"{V1}/pins").json()
    assert [pin["pin_id"] for pin in listed] == [created["pin_id"]]
    assert "token_ids" not in listed[0]

    released = client.delete(f"{V1}/pins/{created['pin_id']}", headers=AUTH)
    assert released.status_code == 200, released.text
    assert released.json()["state"] == "released"
    assert released.json()["released_at"] is not None
    for engine in (fine, coarse):
        assert pin_commands(engine.serve()) == [("unpin", created["pin_id"])]
        assert engine.engine.pins[created["pin_id"]].state.value == "released"
    shown = get_pin(client, created["pin_id"])
    assert states(shown) == {"coarse": "released", "fine": "released"}
    assert all(t["block_ids"] == {} for t in shown["engines"])  # nothing held any more
    again = client.delete(f"{V1}/pins/{created['pin_id']}", headers=AUTH)
    assert again.status_code == 200 and fine.sync() == []  # releasing twice sends nothing
    assert client.get(f"{V1}/pins", params={"state": "active"}).json() == []
    assert len(client.get(f"{V1}/pins", params={"state": "released"}).json()) == 1
    assert len(client.get(f"{V1}/pins", params={"engine_id": "fine"}).json()) == 1
    assert client.get(f"{V1}/pins", params={"engine_id": "nobody"}).json() == []


def test_prefix_forms_and_explicit_targets(client: TestClient, wire) -> None:
    one, two = wire(ledger("one")), wire(ledger("two"))
    segments = [{"seed": 1, "len": 100}, {"seed": 2, "len": 60}]
    pin = post_pin(
        client,
        {"prefix": {"segments": segments}, "label": "seeded", "engine_ids": ["two"]},
    )
    assert (pin["num_tokens"], pin["targets"], pin["boundary"]) == (160, ["two"], {"two": 160})
    assert one.sync() == []
    (command,) = two.serve()
    assert command["payload"]["token_ids"] == segment_tokens(1, 100) + segment_tokens(2, 60)
    by_ids = post_pin(
        client,
        {"prefix": {"token_ids": list(range(40))}, "label": "ids", "engine_ids": ["one", "one"]},
    )
    assert by_ids["boundary"] == {"one": 32}
    assert pin_commands(one.serve()) == [("pin", by_ids["pin_id"])]
    assert get_pin(client, by_ids["pin_id"])["state"] == "materialized"


def test_one_engine_fails_while_another_materializes(client: TestClient, wire) -> None:
    good = wire(ledger("good"))
    bare = wire(ledger("bare", enable_prefix_caching=False))
    pin = post_pin(client, {"prefix": {"text": SYSTEM}, "label": "system"})
    good.serve()
    bare.serve()
    shown = get_pin(client, pin["pin_id"])
    assert shown["state"] == "materialized"
    targets = {t["engine_id"]: t for t in shown["engines"]}
    assert targets["good"]["state"] == "materialized"
    assert targets["bare"]["state"] == "failed"
    assert targets["bare"]["reason"] == "prefix caching is off on this engine"
    assert targets["good"]["block_ids"] and not targets["bare"]["block_ids"]
    only_bare = post_pin(
        client, {"prefix": {"text": SYSTEM}, "label": "bare only", "engine_ids": ["bare"]}
    )
    bare.serve()
    assert get_pin(client, only_bare["pin_id"])["state"] == "failed"


# ---------------------------------------------------------------------------- delivery
def test_a_command_is_on_the_socket_before_the_route_answers_and_sent_once(
    client: TestClient, wire
) -> None:
    """The replica holding the engine sends the command itself before answering, and on
    PostgreSQL skips its own NOTIFY of the same command to the same socket."""
    engine = wire(ledger("once"))
    pin = post_pin(client, {"prefix": {"text": SYSTEM}, "label": "system"})
    assert pin_commands(engine.sync()) == [("pin", pin["pin_id"])]  # before the first ack
    time.sleep(1.0)  # a NOTIFY is delivered within milliseconds; a second copy would be here
    assert engine.sync() == []
    released = client.delete(f"{V1}/pins/{pin['pin_id']}", headers=AUTH)
    assert released.status_code == 200, released.text
    assert pin_commands(engine.sync()) == [("unpin", pin["pin_id"])]
    time.sleep(1.0)
    assert engine.sync() == []


def test_commands_again_after_a_reconnect_and_a_restart(client: TestClient, wire) -> None:
    engine = wire(ledger("e1"))
    first = post_pin(client, {"prefix": {"text": SYSTEM}, "label": "first"})
    engine.serve()
    engine.close()
    # made while the engine is away: pending, sent when it comes back, highest priority first
    second = post_pin(
        client,
        {"prefix": {"text": SYSTEM[:100]}, "label": "second", "engine_ids": ["e1"], "priority": 5},
    )
    doomed = post_pin(client, {"prefix": {"text": SYSTEM[:64]}, "label": "doomed"})
    assert doomed["targets"] == "all" and doomed["engines"] == []  # no engine connected
    assert states(get_pin(client, second["pin_id"])) == {"e1": "pending"}

    engine.connect()  # the same epoch: a reconnect
    assert pin_commands(engine.sync()) == [
        ("pin", second["pin_id"]),
        ("pin", first["pin_id"]),
        ("pin", doomed["pin_id"]),
    ]
    for command in engine.received[-3:]:
        apply_command(engine.engine, msgspec.convert(command, Command))
    engine.engine.run_until_done()
    engine.serve()
    for pin in (first, second, doomed):
        assert states(get_pin(client, pin["pin_id"])) == {"e1": "materialized"}
    engine.close()

    # released while away: the unpin waits for the reconnect
    assert client.delete(f"{V1}/pins/{doomed['pin_id']}", headers=AUTH).status_code == 200
    engine.connect()
    assert pin_commands(engine.sync()) == [
        ("pin", second["pin_id"]),
        ("pin", first["pin_id"]),
        ("unpin", doomed["pin_id"]),
    ]
    for command in engine.received[-3:]:
        apply_command(engine.engine, msgspec.convert(command, Command))
    engine.serve()
    assert engine.engine.pins[doomed["pin_id"]].state.value == "released"
    engine.close()

    # a restart (a new epoch) lost every pin: the active ones go again, the released one not
    restarted = wire(ledger("e1"))
    assert restarted.engine.epoch != engine.engine.epoch
    shown = get_pin(client, first["pin_id"])
    assert states(shown) == {"e1": "pending"}
    assert pin_commands(restarted.serve()) == [("pin", second["pin_id"]), ("pin", first["pin_id"])]
    assert states(get_pin(client, first["pin_id"])) == {"e1": "materialized"}
    assert states(get_pin(client, doomed["pin_id"])) == {"e1": "released"}


def test_text_and_messages_travel_with_every_command_for_the_engine_to_tokenize(
    client: TestClient, wire
) -> None:
    """An engine of a checkpoint has its own tokenizer and template: the command carries the
    text or the messages, the first time and in the resend after a restart."""
    engine = wire(ledger("e1"))
    messages = [{"role": "system", "content": SYSTEM}]
    by_text = post_pin(client, {"prefix": {"text": SYSTEM}, "label": "text"})
    by_messages = post_pin(client, {"prefix": {"messages": messages}, "label": "chat"})
    sent = {c["payload"]["pin_id"]: c["payload"] for c in engine.serve()}
    assert sent[by_text["pin_id"]]["text"] == SYSTEM and "messages" not in sent[by_text["pin_id"]]
    assert sent[by_messages["pin_id"]]["messages"] == messages
    engine.close()
    restarted = wire(ledger("e1"))
    resent = {c["payload"]["pin_id"]: c["payload"] for c in restarted.serve()}
    assert resent[by_text["pin_id"]]["text"] == SYSTEM
    assert resent[by_messages["pin_id"]]["messages"] == messages


def test_a_late_engine_gets_the_all_pins_that_fit_it(client: TestClient, wire) -> None:
    pin = post_pin(client, {"prefix": {"text": SYSTEM[:40]}, "label": "short"})
    listed = post_pin(client, {"prefix": {"text": SYSTEM}, "label": "long"})
    coarse = wire(ledger("coarse", block_size=64, prefix_match_unit=64))
    fine = wire(ledger("fine"))
    assert fine.serve() and pin_commands(fine.received) == [
        ("pin", pin["pin_id"]),
        ("pin", listed["pin_id"]),
    ]
    # 40 tokens floor to 0 on a 64-token grid: that target fails and is never sent
    assert pin_commands(coarse.serve()) == [("pin", listed["pin_id"])]
    shown = get_pin(client, pin["pin_id"])
    targets = {t["engine_id"]: t for t in shown["engines"]}
    assert targets["fine"]["state"] == "materialized"
    assert targets["coarse"]["state"] == "failed"
    assert "boundary of 0" in targets["coarse"]["reason"]
    assert "64-token hit grid" in targets["coarse"]["reason"]


def test_a_released_pin_reported_held_is_unpinned_again(client: TestClient, wire) -> None:
    engine = wire(ledger("e1"))
    pin = post_pin(client, {"prefix": {"text": SYSTEM}, "label": "p"})
    engine.serve()
    held = engine.engine.pins[pin["pin_id"]].event().to_dict()
    client.delete(f"{V1}/pins/{pin['pin_id']}", headers=AUTH)
    engine.serve()
    # a stale report (the engine re-sent its old state) is answered with another unpin, after
    # the batch's ack
    assert engine.send([held]) == []
    assert pin_commands(engine.sync()) == [("unpin", pin["pin_id"])]
    shown = get_pin(client, pin["pin_id"])
    assert states(shown) == {"e1": "released"}
    assert shown["engines"][0]["reason"] == "released by the operator; unpin sent again"


def test_a_snapshot_without_an_active_pin_resends_it(client: TestClient, wire) -> None:
    engine = wire(ledger("e1"))
    pin = post_pin(client, {"prefix": {"text": SYSTEM}, "label": "p"})
    engine.serve()
    seq = engine.seq
    engine.ws.send_text(encode(factories.snapshot(engine.engine, seq=seq) | {"pins": []}))
    assert engine.ws.receive_json() == {"type": "ack", "seq": seq}
    engine.seq += 1
    assert pin_commands(engine.sync()) == [("pin", pin["pin_id"])]
    target = get_pin(client, pin["pin_id"])["engines"][0]
    assert (target["state"], target["reason"]) == (
        "pending",
        f"not in the engine's snapshot {seq}; sent again",
    )


def test_an_engines_own_pin_is_recorded_and_can_be_released(client: TestClient, wire) -> None:
    """A pin the API never made (a replay trace's): recorded under the engine's id."""
    engine = wire(ledger("replayer"))
    engine.engine.pin("system", segment_tokens(7, 300))
    engine.engine.run_until_done()
    engine.serve()
    (pin,) = client.get(f"{V1}/pins").json()
    assert (pin["pin_id"], pin["label"], pin["origin"], pin["num_tokens"]) == (
        "system",
        "system",
        "engine",
        300,
    )
    assert (pin["state"], pin["targets"], pin["boundary"]) == (
        "materialized",
        ["replayer"],
        {"replayer": 288},
    )
    assert get_pin(client, "system", tokens="true")["token_ids"] is None
    client.delete(f"{V1}/pins/system", headers=AUTH)
    assert pin_commands(engine.serve()) == [("unpin", "system")]
    assert engine.engine.pins["system"].state.value == "released"
    engine.close()
    engine.connect()
    assert engine.sync() == []  # nothing to resend: its tokens were never known here


def test_an_engines_pin_on_two_engines_follows_them(client: TestClient, wire) -> None:
    first, second = wire(ledger("a")), wire(ledger("b"))
    for engine in (first, second):
        engine.engine.pin("system", segment_tokens(7, 300))
        engine.engine.run_until_done()
        engine.serve()
    pin = get_pin(client, "system")
    assert (pin["targets"], pin["state"]) == (["a", "b"], "materialized")
    second.engine.unpin("system")
    second.serve()
    assert get_pin(client, "system")["state"] == "materialized"  # a still holds it
    first.engine.unpin("system")
    first.serve()
    assert get_pin(client, "system")["state"] == "released"
    first.engine.pin("system", segment_tokens(7, 300))  # a replay pins it again
    first.engine.run_until_done()
    first.serve()
    assert states(get_pin(client, "system")) == {"a": "materialized", "b": "released"}
    assert get_pin(client, "system")["released_at"] is None
    # forgetting an engine forgets its side of the pin
    second.close()
    assert client.delete(f"{V1}/engines/b", headers=AUTH).status_code == 204
    assert states(get_pin(client, "system")) == {"a": "materialized"}


def test_a_hit_on_a_pin_never_reported_records_it(client: TestClient, wire) -> None:
    engine = wire(ledger("e1"))
    finished = engine.ask(segment_tokens(3, 100))
    engine.send([finished | {"request_id": "odd", "pin_hits": {"elsewhere": 64}}])
    pin = get_pin(client, "elsewhere")
    assert (pin["origin"], pin["num_tokens"], pin["state"]) == ("engine", 64, "materialized")
    (target,) = pin["engines"]
    assert (target["engine_id"], target["boundary"], target["num_hits"]) == ("e1", 64, 1)
    assert target["tokens_saved"] == 64


# ---------------------------------------------------------------------------- what pins save
def test_tokens_saved_add_up_the_pin_hits(client: TestClient, session: Session, wire) -> None:
    engine = wire(ledger("e1"))
    other = wire(ledger("e2"))
    system = segment_tokens(1, 560)
    pin = post_pin(client, {"prefix": {"token_ids": system}, "label": "system"})
    engine.serve()
    other.serve()
    finished = [engine.ask(system + segment_tokens(100 + i, 50)) for i in range(3)]
    finished.append(other.ask(system + segment_tokens(200, 50)))
    unrelated = engine.ask(segment_tokens(9, 300))
    assert all(f["pin_hits"] == {pin["pin_id"]: 560} for f in finished)
    assert unrelated["pin_hits"] == {}
    shown = get_pin(client, pin["pin_id"])
    assert (shown["num_hits"], shown["tokens_saved"]) == (4, 4 * 560)
    targets = {t["engine_id"]: t for t in shown["engines"]}
    assert (targets["e1"]["num_hits"], targets["e1"]["tokens_saved"]) == (3, 3 * 560)
    assert (targets["e2"]["num_hits"], targets["e2"]["tokens_saved"]) == (1, 560)
    # the request rows keep what the events said
    row = session.scalar(select(Request).where(Request.request_id == finished[0]["request_id"]))
    assert row.pin_hits == {pin["pin_id"]: 560}
    assert row.attention_match_key == finished[0]["attention_match_key"]
    assert row.junction_token_ids is None
    rest = client.get(f"{V1}/engines/e1/requests/{finished[0]['request_id']}").json()
    assert rest["pin_hits"] == {pin["pin_id"]: 560}


# ---------------------------------------------------------------------------- junctions
# engines that keep no junction state themselves: what suggested junctions are for
NO_JUNCTIONS = {"junction_checkpoints": False, "checkpoint_mode": "stops"}


def test_suggested_junctions(client: TestClient, wire) -> None:
    engine = wire(ledger("e1", **NO_JUNCTIONS))
    other = wire(ledger("e2", **NO_JUNCTIONS))
    long_prompt, short_prompt = segment_tokens(1, 560), segment_tokens(2, 300)
    # e1: three requests share 560 tokens; the Mamba hit stops at its 512-token block, so the
    # two that follow the first recompute 48 tokens each
    for i in range(3):
        engine.ask(long_prompt + segment_tokens(100 + i, 200))
    # e2: two requests share 300 tokens: the second's attention match is 288, its Mamba hit 0
    first = other.ask(short_prompt + segment_tokens(200, 100))
    second = other.ask(short_prompt + segment_tokens(201, 100))
    assert first["attention_match_key"] is None
    assert second["hit_tokens_by_group"] == {"attention": 288, "mamba": 0}
    # ...and e1 sees the 300-token prefix once, after which it is short of it again
    engine.ask(short_prompt + segment_tokens(202, 100))
    engine.ask(short_prompt + segment_tokens(203, 100))

    body = client.get(f"{V1}/junctions/suggested").json()
    assert (body["engine_id"], body["limit"]) == (None, 20)
    ranked = [
        (j["boundary"], j["num_requests"], j["num_short_requests"], j["tokens_saved"])
        for j in body["junctions"]
    ]
    assert ranked == [(288, 2, 2, 2 * 288), (560, 2, 2, 2 * 48)]
    top, runner_up = body["junctions"]
    assert top["engine_ids"] == ["e1", "e2"] and runner_up["engine_ids"] == ["e1"]
    assert top["key"] == second["attention_match_key"]
    assert top["pin_request"] == {
        "prefix": {"token_ids": short_prompt[:288]},
        "label": "junction@288",
    }
    assert runner_up["pin_request"]["prefix"]["token_ids"] == long_prompt
    only_e2 = client.get(f"{V1}/junctions/suggested", params={"engine_id": "e2"}).json()
    assert [(j["boundary"], j["tokens_saved"], j["engine_ids"]) for j in only_e2["junctions"]] == [
        (288, 288, ["e2"])
    ]
    limited = client.get(f"{V1}/junctions/suggested", params={"limit": 1}).json()
    assert [j["boundary"] for j in limited["junctions"]] == [288]

    # pin the runner-up as suggested: once materialized, it is no longer suggested
    pinned = post_pin(client, runner_up["pin_request"], 201)
    assert pinned["label"] == "junction@560" and pinned["boundary"] == {"e1": 560, "e2": 560}
    engine.serve()
    other.serve()
    assert states(get_pin(client, pinned["pin_id"])) == {
        "e1": "materialized",
        "e2": "materialized",
    }
    assert get_pin(client, pinned["pin_id"])["engines"][0]["keys"]["mamba"] == runner_up["key"]
    after = client.get(f"{V1}/junctions/suggested").json()
    assert [j["boundary"] for j in after["junctions"]] == [288]
    hit = engine.ask(long_prompt + segment_tokens(300, 200))
    assert hit["num_cached_tokens"] == 560 and hit["junction_token_ids"] is None
    assert get_pin(client, pinned["pin_id"])["tokens_saved"] == 560


def test_a_short_shared_opening_is_not_suggested_unless_asked_for(client: TestClient, wire) -> None:
    """Chats share a template header and a system prompt's first words: a 48-token junction
    saves too little to pin, so only `min_tokens` at or below it shows it."""
    engine = wire(ledger("e1", **NO_JUNCTIONS))
    opening = segment_tokens(1, 48)
    for i in range(3):
        engine.ask(opening + segment_tokens(100 + i, 300))
    assert client.get(f"{V1}/junctions/suggested").json()["junctions"] == []
    for min_tokens, shown in ((0, [48]), (48, [48]), (49, [])):
        body = client.get(f"{V1}/junctions/suggested", params={"min_tokens": min_tokens}).json()
        assert [j["boundary"] for j in body["junctions"]] == shown, min_tokens
    for bad in (-1, 2**31):
        refused = client.get(f"{V1}/junctions/suggested", params={"min_tokens": bad})
        assert refused.status_code == 422, bad


def test_suggested_junctions_bad_params(client: TestClient) -> None:
    assert client.get(f"{V1}/junctions/suggested").json()["junctions"] == []
    ghost = client.get(f"{V1}/junctions/suggested", params={"engine_id": "ghost"})
    assert (ghost.status_code, ghost.json()["detail"]) == (404, "engine 'ghost' not found")
    for limit in (0, 1001):
        response = client.get(f"{V1}/junctions/suggested", params={"limit": limit})
        assert response.status_code == 422


# ---------------------------------------------------------------------------- bad input
BAD_PINS = {
    # name: (body, status, the message's telling part)
    "empty text": ({"prefix": {"text": ""}, "label": "x"}, 422, "the prefix is empty"),
    "empty token ids": ({"prefix": {"token_ids": []}, "label": "x"}, 422, "prefix is empty"),
    "empty segments": ({"prefix": {"segments": []}, "label": "x"}, 422, "prefix is empty"),
    "two forms": (
        {"prefix": {"text": "abc", "token_ids": [1]}, "label": "x"},
        422,
        "exactly one form: text, token_ids, segments or messages (got text, token_ids)",
    ),
    "no form": ({"prefix": {}, "label": "x"}, 422, "exactly one form"),
    "negative token id": (
        {"prefix": {"token_ids": [1, -2]}, "label": "x"},
        422,
        "greater than or equal to 0",
    ),
    "a bad segment": (
        {"prefix": {"segments": [{"seed": 1, "len": 0}]}, "label": "x"},
        422,
        "greater than 0",
    ),
    "no label": ({"prefix": {"text": SYSTEM}}, 422, "Field required"),
    "empty label": ({"prefix": {"text": SYSTEM}, "label": ""}, 422, "at least 1 character"),
    "an unknown field": (
        {"prefix": {"text": SYSTEM}, "label": "x", "engine": "e1"},
        422,
        "Extra inputs are not permitted",
    ),
    "no engines listed": (
        {"prefix": {"text": SYSTEM}, "label": "x", "engine_ids": []},
        422,
        "at least 1 item",
    ),
    "a boundary of 0": (
        {"prefix": {"text": "too short"}, "label": "x"},
        422,
        "the prefix's 9 tokens floor to a boundary of 0 on engine 'e1''s 16-token hit grid "
        "(hit_alignment 16); pin at least 16 tokens",
    ),
    "longer than the engine takes": (
        {"prefix": {"token_ids": list(range(300))}, "label": "x", "engine_ids": ["small"]},
        422,
        "the prefix's 300 tokens exceed engine 'small''s max_model_len of 256",
    ),
    "an unknown engine": (
        {"prefix": {"text": SYSTEM}, "label": "x", "engine_ids": ["e1", "ghost", "gone"]},
        404,
        "engines 'ghost', 'gone' not found",
    ),
}


@pytest.mark.parametrize("case", list(BAD_PINS), ids=list(BAD_PINS))
def test_bad_pins_are_refused_and_leave_nothing(client: TestClient, wire, case: str) -> None:
    engine = wire(ledger("e1"))
    small = wire(ledger("small", max_model_len=256))
    body, status, message = BAD_PINS[case]
    response = client.post(f"{V1}/pins", json=body, headers=AUTH)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    text = detail if isinstance(detail, str) else "; ".join(item["msg"] for item in detail)
    assert message in text
    assert client.get(f"{V1}/pins").json() == []
    assert engine.sync() == [] and small.sync() == []


def test_pin_writes_need_the_token_and_unknown_pins_are_404(
    client: TestClient, anonymous: TestClient
) -> None:
    body = {"prefix": {"text": SYSTEM}, "label": "x"}
    missing = anonymous.post(f"{V1}/pins", json=body)
    assert missing.status_code == 401
    assert missing.json()["detail"].startswith("missing bearer token")
    wrong = client.post(f"{V1}/pins", json=body, headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()["detail"]) == (401, "wrong bearer token")
    pin = post_pin(client, body)
    assert anonymous.delete(f"{V1}/pins/{pin['pin_id']}").status_code == 401
    assert get_pin(client, pin["pin_id"])["state"] == "pending"
    for response in (
        client.get(f"{V1}/pins/pin-nope"),
        client.delete(f"{V1}/pins/pin-nope", headers=AUTH),
    ):
        assert (response.status_code, response.json()["detail"]) == (
            404,
            "pin 'pin-nope' not found",
        )
    assert client.get(f"{V1}/pins", params={"state": "stuck"}).status_code == 422


# ----------------------------------------------------- engines bridged by `junction attach`
def test_a_bridged_engine_takes_no_pin(client: TestClient, wire) -> None:
    """A vLLM engine's bridge cannot materialize a pin: an "all" pin leaves it out, before and
    after its hello, and a pin that names it is refused, naming it."""
    from tests.api.test_peer_blocks import peer_socket

    fine = wire(ledger("fine"))
    with peer_socket(client):
        created = post_pin(client, {"prefix": {"text": SYSTEM}, "label": "all"})
        assert states(created) == {"fine": "pending"}
        refused = post_pin(
            client,
            {"prefix": {"text": SYSTEM}, "label": "one", "engine_ids": ["vllm-a"]},
            status=422,
        )
        assert "'vllm-a'" in refused["detail"] and "takes no pins" in refused["detail"]
    with peer_socket(client):  # a later hello of the bridge adds no target either
        assert states(get_pin(client, created["pin_id"])) == {"fine": "pending"}
    fine.serve()
