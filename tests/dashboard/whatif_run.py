"""A what-if run of the stack's replayed engine, done: queued through REST with the form's
presets (as vLLM would, LRU, memory ×0.5 and ×2) and run as a worker would (`jobs.whatif`)."""

from __future__ import annotations

from client.schema import CacheGeometry
from dashboard.forms.whatif import Choices, build_settings
from tests.dashboard.conftest import REPLAY_ENGINE, Stack

CHOICES = Choices(vllm=True, evictions=("lru",), memory=(0.5, 2.0))
_DONE: dict[str, int] = {}  # the stack's API URL -> its run's id


def ensure_whatif(stack: Stack) -> dict:
    """The done run (made once per stack)."""
    from jobs.runs import store_sessions
    from jobs.whatif import run_whatif_run

    if stack.url not in _DONE:
        geometry = CacheGeometry.from_json(stack.get(f"/engines/{REPLAY_ENGINE}")["geometry"])
        settings = build_settings(CHOICES, geometry)
        run = stack.post(f"/engines/{REPLAY_ENGINE}/whatif", {"settings": settings})
        done = run_whatif_run(run["id"], sessions=store_sessions(stack.database_url))
        assert done.status == "done", done
        _DONE[stack.url] = run["id"]
    return stack.get(f"/whatif/{_DONE[stack.url]}")
