"""`GET /v1/models`: the one model this engine serves, with where it comes from, its
architecture and the cache geometry (`engine.setup.model_card`) beside OpenAI's fields."""

from __future__ import annotations

from fastapi import APIRouter

from protocol.errors import OpenAIError
from serve.deps import ServerState, StateDep

router = APIRouter(prefix="/v1", tags=["openai"])


def _model_card(state: ServerState) -> dict:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "junction",
        "root": state.model_card["source"],
        "junction": state.model_card,
    }


@router.get("/models")
async def list_models(state: StateDep) -> dict:
    return {"object": "list", "data": [_model_card(state)]}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, state: StateDep) -> dict:
    if model != state.model_name:
        raise OpenAIError(
            f"model {model!r} is not served here; this server serves {state.model_name!r}",
            status_code=404,
            param="model",
            code="model_not_found",
        )
    return _model_card(state)
