"""One request's miss attribution in words: whether it has one yet, the tokens it shared and
missed by reason as table columns, and a sentence of what it shared, hit and missed and why its
hit stopped. From each request's `attribution` (`GET /engines/{id}/requests`)."""

from __future__ import annotations

from client.types import RequestOut
from dashboard.figures.reasons import REASONS, STOP_LABELS, STOP_REASONS


def is_attributed(request: RequestOut) -> bool:
    attribution = request.attribution
    return attribution is not None and attribution.state == "attributed"


def attribution_status(request: RequestOut) -> str:
    """`attributed`, `pending` (an earlier request is still in flight), or `not recorded`
    (stored before the control plane attributed misses)."""
    attribution = request.attribution
    return attribution.state if attribution else "not recorded"


def missed_text(missed: dict[str, int]) -> str:
    """`"32 no state · 16 held back"`, the reasons that missed tokens; `"none"` if none did."""
    parts = [f"{missed[r]:,} {s.label}" for r, s in REASONS.items() if missed.get(r)]
    return " · ".join(parts) or "none"


def request_columns(request: RequestOut) -> dict:
    """A request's attribution as table columns: the tokens it shared and missed (None until
    it has an attribution), the missed tokens by reason (or why there are none yet) and why
    its hit stopped."""
    status = attribution_status(request)
    if not is_attributed(request):
        return {"shared": None, "missed": None, "missed because": status, "hit stopped": None}
    attribution = request.attribution
    missed = attribution.missed_tokens
    return {
        "shared": attribution.shared_tokens,
        "missed": sum(missed.values()),
        "missed because": missed_text(missed),
        "hit stopped": STOP_LABELS.get(attribution.stop_reason, attribution.stop_reason),
    }


def attribution_sentence(request: RequestOut) -> str:
    """What a request shared, hit and missed, and why its hit stopped, in plain words."""
    status = attribution_status(request)
    if status == "pending":
        return (
            "Miss attribution **pending**: the control plane attributes a request once every "
            "request that arrived before it has finished."
        )
    if status != "attributed":
        return "No miss attribution: this request was stored before the control plane kept one."
    attribution = request.attribution
    missed = attribution.missed_tokens
    shared = attribution.shared_tokens
    text = (
        f"Shared **{shared:,}** tokens with earlier requests or pins; hit "
        f"**{request.num_cached_tokens:,}**, missed **{sum(missed.values()):,}**"
        + (f" ({missed_text(missed)})" if sum(missed.values()) else "")
        + f". The hit stopped because {STOP_REASONS.get(attribution.stop_reason, '?')}."
    )
    text += (
        f" The prompt left the cache at token **{request.num_cached_tokens:,}** (where the hit "
        f"stopped) and diverged from the longest earlier prefix at token **{shared:,}** (on the "
        "match-unit grid): the diagnosis the engine answers a request that asks for it "
        "(`junction.diagnose`)."
    )
    steps = attribution.copy_wait_steps
    if steps:
        text += f" It waited {steps:,} steps for a checkpoint's copy instead of missing it."
    return text
