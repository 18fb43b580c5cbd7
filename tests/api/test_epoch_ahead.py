"""An engine whose clock runs ahead of the control plane's (issue 48, item 12): its epoch (the
engine's start time, in ns) is let in up to `JUNCTION_MAX_EPOCH_AHEAD_S` (300 s) ahead and
refused (4409, naming the setting) past it. The epochs are seconds apart, not decades, so a
slip of units (milliseconds read as seconds, or the bound in ns) shows; on SQLite and
PostgreSQL, the store's function at a frozen clock and a real socket at the real one."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from sqlalchemy.orm import Session

from api.ingest import lease
from api.ingest.frames import apply_hello
from api.ingest.lease import LeaseConfig
from api.settings import Settings
from api.store.models import Engine
from engine.wire import CLOSE_WRONG_ENGINE, Hello, WireError, encode
from tests.api.test_ingest_server import ingest

NOW_NS = 1_800_000_000 * 10**9  # the API's clock, held still at the boundary
S = 10**9  # ns


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "time", SimpleNamespace(time_ns=lambda: NOW_NS))


@pytest.mark.parametrize("ahead_s", [0, 3, 299])
def test_an_epoch_up_to_the_bound_ahead_is_let_in(
    session: Session, settings: Settings, frozen_clock: None, ahead_s: int
) -> None:
    config = LeaseConfig.from_settings(settings)
    assert config.max_epoch_ahead_s == 300  # JUNCTION_MAX_EPOCH_AHEAD_S's default
    epoch = NOW_NS + ahead_s * S
    welcome = apply_hello(session, Hello(engine_id="ahead", epoch=epoch), lease=config)
    assert (welcome.epoch, welcome.next_seq) == (epoch, 0)
    assert session.get(Engine, "ahead", populate_existing=True).epoch == epoch


def test_an_epoch_past_the_bound_is_refused_naming_the_setting(
    session: Session, settings: Settings, frozen_clock: None
) -> None:
    config = LeaseConfig.from_settings(settings)
    apply_hello(session, Hello(engine_id="ahead", epoch=NOW_NS - 60 * S), lease=config)
    with pytest.raises(WireError) as error:
        apply_hello(session, Hello(engine_id="ahead", epoch=NOW_NS + 301 * S), lease=config)
    assert error.value.code == CLOSE_WRONG_ENGINE
    assert "301 s ahead" in error.value.reason
    assert "JUNCTION_MAX_EPOCH_AHEAD_S" in error.value.reason
    # the engine's table is left as it was: its stored epoch is the one before
    assert session.get(Engine, "ahead", populate_existing=True).epoch == NOW_NS - 60 * S


def test_the_bound_is_the_setting(session: Session, settings: Settings, frozen_clock) -> None:
    """`JUNCTION_MAX_EPOCH_AHEAD_S=10`: 9 s ahead is let in, 11 s refused."""
    config = LeaseConfig.from_settings(settings.model_copy(update={"max_epoch_ahead_s": 10.0}))
    assert apply_hello(session, Hello(engine_id="near", epoch=NOW_NS + 9 * S), lease=config)
    with pytest.raises(WireError) as error:
        apply_hello(session, Hello(engine_id="far", epoch=NOW_NS + 11 * S), lease=config)
    assert error.value.code == CLOSE_WRONG_ENGINE
    assert session.get(Engine, "far") is None


@pytest.mark.parametrize("ahead_s", [3, 299])
def test_an_engine_whose_clock_runs_ahead_is_welcomed_over_the_socket(
    server: str, session: Session, ahead_s: int
) -> None:
    """The real clock: the epoch is ahead by at most `ahead_s` when the API reads it."""
    epoch = time.time_ns() + ahead_s * S
    with ingest(server) as ws:
        ws.send(encode(Hello(engine_id="fast-clock", epoch=epoch)))
        assert json.loads(ws.recv(timeout=10)) == {"type": "welcome", "epoch": epoch, "next_seq": 0}
    assert session.get(Engine, "fast-clock").epoch == epoch
