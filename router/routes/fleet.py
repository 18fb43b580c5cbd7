"""`GET /fleet`, `/fleet/decisions` and `/fleet/decisions/{id}`: each engine's state and share,
and why each request went where it went. They take the bearer token (`router.deps`)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from engine.events import ATTENTION, GROUPS, MAMBA
from protocol.errors import OpenAIError
from router.deps import Authorized, StateDep
from router.fleet import Fleet

router = APIRouter(prefix="/fleet", tags=["fleet"])


@router.get("", dependencies=[Authorized])
async def fleet_view(state: StateDep) -> dict:
    """Each engine: its state, what it holds, its load and share of the routed requests; and
    the fleet's: `ready`, or `degraded` with the engines it waits for (`router.readiness`)."""
    return {**state.readiness.view(), **fleet_summary(state.fleet)}


@router.get("/decisions", dependencies=[Authorized])
async def decisions(state: StateDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict:
    """The latest routing decisions, newest first, each with every engine's score."""
    recent = list(state.fleet.decisions.values())[-limit:]
    return {"decisions": [d.as_dict() for d in reversed(recent)]}


@router.get("/decisions/{request_id}", dependencies=[Authorized])
async def decision(request_id: str, state: StateDep) -> dict:
    """One decision, by the router's id (`X-Junction-Route-Id`) or the engine's (`id`)."""
    for found in reversed(state.fleet.decisions.values()):
        if request_id in (found.request_id, found.engine_request_id):
            return found.as_dict()
    raise OpenAIError(
        f"no decision {request_id!r} among the last {state.fleet.max_decisions}",
        404,
        param="request_id",
        code="not_found",
    )


def fleet_summary(fleet: Fleet) -> dict:
    total = sum(e.num_routed for e in fleet.engines.values())
    engines = []
    now = time.monotonic()
    for engine in fleet.engines.values():
        load = engine.load
        engines.append(
            {
                "url": engine.url,
                "serve_url": engine.openai_url,
                "engine_id": engine.engine_id,
                "model": engine.model,
                "status": engine.status,
                "down_reason": engine.down_reason,
                "last_frame_age_s": round(now - engine.last_frame_ts, 3)
                if engine.last_frame_ts
                else None,
                "num_keys": dict(zip(GROUPS, engine.index.num_keys, strict=True))
                if engine.index
                else dict.fromkeys(GROUPS, 0),
                "load": {
                    "num_running": load.num_running,
                    "num_waiting": load.num_waiting,
                    "num_prefill_tokens": load.num_prefill_tokens,
                    "usage": {ATTENTION: load.attention_usage, MAMBA: load.mamba_usage},
                },
                "num_in_flight": len(engine.in_flight),
                "num_expected": len(engine.expected),
                "num_routed": engine.num_routed,
                "routed_share": engine.num_routed / total if total else 0.0,
                "num_prompt_tokens": engine.num_prompt_tokens,
                "num_predicted_tokens": engine.num_predicted_tokens,
                "num_realised_tokens": engine.num_realised_tokens,
                "hit_rate": engine.num_realised_tokens / engine.num_prompt_tokens
                if engine.num_prompt_tokens
                else 0.0,
                "num_failed": engine.num_failed,
                "num_snapshots": engine.num_snapshots,
                "num_tier_keys": {m: len(units) for m, units in engine.index.tiers.items()}
                if engine.index
                else {"host": 0, "disk": 0},
                "rates": {
                    f: getattr(engine.rates, f)
                    for f in engine.rates.__struct_fields__
                    if f != "shared_up"  # said as `shared_store`
                },
                "rates_measured": engine.load.rates is not None,  # else the router's defaults
                "shared_store": engine.shared_store,
            }
        )
    down = [e["engine_id"] or e["url"] for e in engines if e["shared_store"] == "down"]
    return {
        "policy": fleet.policy.name,
        "num_shared_keys": len(fleet.shared),
        # said once here, as each engine's log says it once: hits lost, never a wrong read
        "shared_store": (
            f"down for {', '.join(down)}: their hits from it are lost until it is back"
            if down
            else None
        ),
        "num_routed": total,
        "agreement": fleet.agreement,
        "num_compared": fleet.num_compared,
        "engines": engines,
    }
