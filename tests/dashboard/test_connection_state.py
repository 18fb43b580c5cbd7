"""An engine's heading names the control plane replica that holds its socket."""

from __future__ import annotations

from client.types import EngineOut
from dashboard.connection import connection_state
from tests.dashboard.bodies import body


def test_the_heading_names_the_replica_of_a_connected_engine() -> None:
    assert connection_state(body(EngineOut, {"connected": True, "replica_id": "api-1-7f3a"})) == (
        "connected (replica api-1-7f3a)"
    )
    assert connection_state(body(EngineOut, {"connected": True, "replica_id": None})) == "connected"
    assert (
        connection_state(body(EngineOut, {"connected": False, "replica_id": "api-1-7f3a"}))
        == "disconnected"
    )
