"""Operational endpoints: `/health`, `/metrics` (Prometheus text) and `/debug/blocks` (the live
block table, in the shape of the control plane's block-table endpoint)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from engine.engine import Engine
from engine.wire import BLOCK_STATES
from protocol.errors import OpenAIError, error_body
from serve.deps import StateDep
from serve.request_stream import EngineDeadError

router = APIRouter(tags=["ops"])


@router.get("/health")
async def health(state: StateDep) -> JSONResponse:
    engine = state.async_engine
    if not engine.is_running:
        message = f"engine {engine.engine.engine_id} is not running"
        if engine.error is not None:
            message += f": {engine.error!r}"
        return JSONResponse(error_body(message, "server_error", code="engine_dead"), 503)
    tiering = engine.engine.scheduler.tiering
    shared = None if tiering is None or tiering.shared is None else tiering.shared
    return JSONResponse(
        {
            "status": "ok",
            "engine_id": engine.engine.engine_id,
            "model": state.model_name,
            "num_in_flight": engine.num_in_flight,
            # the shared tier's store: answering or not (`engine.tiers.shared`); null without one
            "shared_store": None
            if shared is None
            else {"url": shared.store.describe(), "up": shared.is_up},
        }
    )


@router.get("/metrics")
async def metrics(state: StateDep) -> Response:
    try:
        usage = await state.async_engine.call(Engine.cache_usage)
        state.metrics.tiers = await state.async_engine.call(Engine.tier_stats)
    except EngineDeadError:
        pass  # the request metrics still tell what happened before the engine stopped
    else:
        state.metrics.observe_cache_usage(usage)
    return Response(state.metrics.render(), media_type=state.metrics.content_type)


@router.get("/debug/blocks")
async def debug_blocks(
    state: StateDep,
    group: Annotated[str | None, Query(description="only this cache group's blocks")] = None,
    block_state: Annotated[
        str | None, Query(alias="state", description="only blocks in this state")
    ] = None,
) -> JSONResponse:
    snapshot = await state.async_engine.call(Engine.snapshot)
    if group is not None and group not in snapshot["groups"]:
        raise OpenAIError(
            f"unknown group {group!r}: choose one of {', '.join(snapshot['groups'])}",
            param="group",
        )
    if block_state is not None and block_state not in BLOCK_STATES:
        raise OpenAIError(
            f"unknown state {block_state!r}: choose one of {', '.join(BLOCK_STATES)}",
            param="state",
        )
    snapshot["blocks"] = [
        block
        for block in snapshot["blocks"]
        if (group is None or block["group"] == group)
        and (block_state is None or block["state"] == block_state)
    ]
    return JSONResponse(snapshot)  # already plain JSON: skip FastAPI's encoder on a big table
