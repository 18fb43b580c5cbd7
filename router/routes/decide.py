"""`POST /fleet/route`: what this router would choose for a request, without sending it.

The body is a `/v1/completions` body (a text prompt or token ids) or a `/v1/chat/completions`
one (`messages`), read, checked and tokenized as those routes do (bounded by `--max-body-bytes`).
The choice is scored as a routed request's is, on this router's view now (its engines' feeds and
what it has in flight), and is neither recorded nor counted: two routers asked the same body at
the same moment should answer the same engine (a restarted one once its `/fleet` says `ready`).
It takes the bearer token, as `/fleet` does.
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request

from protocol.errors import OpenAIError
from router.deps import Authorized, StateDep
from router.fleet import NoEngineError
from router.routes.openai import prepare

router = APIRouter(prefix="/fleet", tags=["fleet"])


@router.post("/route", dependencies=[Authorized])
async def choose(request: Request, state: StateDep) -> dict:
    """The engine this router would send the body to, why, and every engine's score."""
    ready = await prepare(request, state)
    try:
        decision = state.fleet.route(
            ready.token_ids,
            ready.model,
            num_tokens_held=ready.num_tokens_held,
            record=False,
            cache_key=ready.cache_key,
        )
    except NoEngineError:
        raise OpenAIError(
            f"no engine serving {ready.model!r} is up: see GET /fleet for each engine's state",
            503,
            code="no_engine",
            type="server_error",
        ) from None
    return {
        "url": decision.url,
        "engine_id": decision.engine_id,
        "reason": decision.reason,
        "policy": decision.policy,
        "model": decision.model,
        "num_prompt_tokens": decision.num_prompt_tokens,
        "predicted_hit": decision.predicted_hit,
        "predicted_s": decision.predicted_s,
        "min_hit": decision.min_hit,
        "fleet": state.readiness.observe(),
        "scores": [asdict(score) for score in decision.scores],
    }
