"""A what-if whose setting cannot place a pin still runs (issue 47, item 14): the README tour
pins an 80-token system prompt (`junction pin --label support`) on an engine whose hit grid
is 16 tokens; "as vLLM would" hits only on its 512-token Mamba blocks, where that pin floors to
nothing. The run, queued with the dashboard form's default settings over the store's
recording (both backends), ends done: the vLLM setting's result says the pin, by its label,
was not placed and why, and every setting's result is complete."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import update

from api.store.db import make_engine, make_sessionmaker
from api.store.models import Pin, WhatIfRun
from api.whatif import runs as store
from engine.engine import Engine
from jobs import whatif
from jobs.runs import Done
from tests.api import factories

#: the dashboard form's default ("as vLLM would", both pools x2) and the docs' eviction
DEFAULT_SETTINGS = [
    {"label": "as vLLM would", "mode": "vllm"},
    {"label": "lru", "eviction": "lru"},
    {"label": "memory ×2", "num_blocks": 176, "num_mamba_blocks": 24},
]


def short_pin_engine() -> Engine:
    """A ledger engine that pinned an 80-token prefix (as the API names pins) and served 6
    requests that start with it."""
    rng = random.Random(7)
    engine = Engine(
        factories.CACHE, factories.SCHEDULER, runner="ledger", engine_id="whatif-short-pin"
    )
    system = factories.tokens(rng, 80)
    engine.pin("pin-5e1f0c2a9b3d", system)
    engine.run_until_done()
    for _ in range(6):
        engine.add_request(system + factories.tokens(rng, rng.randrange(20, 120)))
        engine.run_until_done()
    return engine


def test_a_pin_one_setting_cannot_place_does_not_sink_the_run(database_url):
    db = make_engine(database_url)
    sessions = make_sessionmaker(db)
    engine = short_pin_engine()
    with sessions() as session:
        factories.ingest(session, engine)
        # the pin as `junction pin --label support` made it: its id is not its name
        session.execute(update(Pin).values(label="support"))
        session.commit()
        run_id = store.submit_run(
            session, engine.engine_id, engine.epoch, DEFAULT_SETTINGS, lambda *_: None, 10
        ).id
    try:
        assert whatif.run_whatif_run(run_id, sessions=sessions) == Done(run_id, "done")
        with sessions() as session:
            run = session.get(WhatIfRun, run_id)
            assert (run.status, run.error) == ("done", None)
            report = run.result
    finally:
        db.dispose()
    by_label = {result["label"]: result for result in report["results"]}
    assert set(by_label) == {s["label"] for s in DEFAULT_SETTINGS}
    [unplaced] = by_label["as vLLM would"]["pins_not_placed"]
    assert unplaced["pin"] == "support"
    assert "its 80 tokens floor to a boundary of 0" in unplaced["reason"]
    assert "512-token hit grid" in unplaced["reason"]
    for label in ("lru", "memory ×2"):
        assert by_label[label]["pins_not_placed"] == []
    assert report["as_ran"]["pins_not_placed"] == [] and report["num_requests"] == 6
    for result in report["results"]:
        assert result["num_prompt_tokens"] == report["num_prompt_tokens"]
        assert 0 <= result["hit_tokens"] <= result["oracle_tokens"]


def test_memory_that_cannot_hold_a_request_beside_the_pins_is_said_before_queueing(
    database_url,
):
    """The form's "memory ×0.5" of this engine leaves 6 state slots: one held by the pin, and
    the longest request may need 6 more. The engine refuses that request; the check before a
    run is queued now counts the pinned slot too, so the setting is named there (422 at the
    API), not found by a worker mid-run."""
    from api.whatif.recording import request_sizes
    from whatif.settings import WhatIfSetting, apply, check_memory, ran_configs

    db = make_engine(database_url)
    engine = short_pin_engine()
    try:
        with make_sessionmaker(db)() as session:
            factories.ingest(session, engine)
            longest, pins = request_sizes(session, engine.engine_id, engine.epoch)
    finally:
        db.dispose()
    half = WhatIfSetting(label="memory ×0.5", num_blocks=44, num_mamba_blocks=6)
    ran, _ = ran_configs(engine.cache_geometry())
    with pytest.raises(ValueError, match="'memory ×0.5': the longest request") as refused:
        check_memory(apply(half, ran, 16), longest, pins, half.name())
    assert "raise num_mamba_blocks" in str(refused.value)
