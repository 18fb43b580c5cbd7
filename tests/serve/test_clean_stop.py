"""Issue 47, item 15: an engine stopped cleanly (SIGTERM, as `junction up` stops it on Ctrl-C)
says its feed's goodbye before it exits, so the control plane ends its lease on the engine id
at once: the same engine started again right away is accepted, with no "in use" refusal. Real
processes: `junction api` and `junction serve`, twice on the same id and port.

uvicorn raises SIGTERM again once it has stopped, and the default handler killed the engine
there (exit -15) before the goodbye; the control plane then held the id for
`JUNCTION_ENGINE_LEASE_S` (made long here, so the test cannot pass by waiting it out)."""

from __future__ import annotations

from pathlib import Path

from tests.api.processes import ApiProcess, Serve, api_engine, free_port
from tests.polling import wait_for

ENGINE_ID = "restarted-0"


def test_a_cleanly_stopped_engine_restarts_on_its_id_at_once(tmp_path: Path) -> None:
    api = ApiProcess(
        f"sqlite:///{tmp_path / 'junction.db'}",
        free_port(),
        env={"JUNCTION_ENGINE_LEASE_S": "600"},
    )
    api.start()
    try:
        first = Serve(api, ENGINE_ID, runner="null")
        first.stop()  # SIGTERM
        said = first.process.stderr.read().decode()
        assert first.process.returncode == 0, said  # through its goodbye, not killed (-15)
        wait_for(
            "the engine to be disconnected", lambda: not api_engine(api, ENGINE_ID)["connected"]
        )
        # accepted within Serve's start timeout (60 s): 600 s had it still held
        second = Serve(api, ENGINE_ID, runner="null", port=first.port)
        second.stop()
        said = second.process.stderr.read().decode()
        assert "in use" not in said, said
        assert second.process.returncode == 0, said
    finally:
        api.kill()
