"""The router's decisions in words, for the Fleet page: why one request went where it went
(its reason, the hit predicted and realised, the engines that refused it first), what each
policy ranks the engines by, and the latest decisions as a table."""

from __future__ import annotations

import pandas as pd

from client.types import Decision
from dashboard.figures.fleet import engine_label

#: Why the policy chose the engine it chose, by the decision's `reason`.
REASONS = {
    "hit": "its cache gave the largest usable hybrid hit, less its load",
    "in_flight": "a request of the same family being prefilled there leaves the largest hit",
    "least_loaded": "no engine had a hit worth its load, so the least loaded one",
    "round_robin": "its turn in the round robin (the scores are not used)",
    "random": "a random choice (the scores are not used)",
    "cache_key": "the engine of its prompt_cache_key, within the router's spill margin of the "
    "policy's choice",
    "cache_key_spill": "its prompt_cache_key's engine was too busy (predicted prefill seconds "
    "over the spill margin above the policy's choice), so the policy's choice; the key moved",
}
#: What each policy ranks the engines by.
SCORES = {
    "hybrid": "chosen by the fewest predicted prefill seconds: (prompt − gain counted + load) / "
    "the engine's prefill rate + the seconds loading the gain from host, disk or the shared "
    "store takes, less the credit's; the gain being max(usable hit with its tiers, hit in "
    "flight) and the credit the load of the prefill that hit in flight is waiting for (score "
    "below: gain − load + credit)",
    "hybrid_device": "score = gain counted − load + credit, the gain being max(usable hybrid "
    "hit on the device, hit in flight) and the credit the load of the prefill that hit in "
    "flight is waiting for",
    "lmetric": "chosen by the fewest uncached tokens × (requests in flight + 1), the hit "
    "counted as hybrid counts it (score below: gain − load)",
    "attention": "score = gain counted − load, the gain being the attention match (matches no "
    "recurrent state backs count too)",
}


def score_terms(d: Decision) -> str:
    """How the decision's scores add up, and why a hit can count as 0: a gain under the
    router's minimum (`--min-hit-share` of the prompt) is none, so "hit 16, load 0" scores 0."""
    if d.policy not in SCORES:
        return "this policy does not score: every score is 0"
    return (
        f"{SCORES[d.policy]}; a gain under {d.min_hit:,} tokens (the router's "
        f"`--min-hit-share` of this {d.num_prompt_tokens:,}-token prompt) counts as 0"
    )


def decisions_frame(decisions: list[Decision]) -> pd.DataFrame:
    rows = [
        {
            "request": d.request_id,
            "engine request": d.engine_request_id,
            "engine": engine_label(d.engine_id, d.url),
            "reason": d.reason,
            "prompt tokens": d.num_prompt_tokens,
            "predicted hit": d.predicted_hit,
            "realised hit": d.realised_hit,
            "status": d.status,
        }
        for d in decisions
    ]
    return pd.DataFrame(rows).astype({"realised hit": "Int64"})


def decision_text(d: Decision) -> str:
    base, _, failure = d.reason.partition("; failed: ")
    why = REASONS.get(base, base)
    realised = "not yet known" if d.realised_hit is None else f"{d.realised_hit:,}"
    text = (
        f"**{d.request_id}** ({d.num_prompt_tokens:,} prompt tokens of `{d.model}`) "
        f"went to **{engine_label(d.engine_id, d.url)}** ({d.url}) under the "
        f"`{d.policy}` policy, reason **{base}**: {why}. Predicted hit "
        f"{d.predicted_hit:,}, realised {realised} ({d.status}); routed in "
        f"{d.route_s * 1000:.2f} ms."
    )
    if d.engine_request_id:
        text += f" The engine's id: `{d.engine_request_id}`."
    if d.cache_key is not None:
        home = "new" if d.cache_key_home is None else f"its engine was {d.cache_key_home}"
        text += f" Its prompt_cache_key: `{d.cache_key}` ({home})."
    if d.branch_hint is not None:
        text += (
            f" The router asked it to keep a state at token {d.branch_hint:,}: the prompt "
            "shares that much with what another engine holds or computes, and this one had not "
            "seen it."
        )
    if d.failed_over_from:
        text += f" Refused first by {', '.join(d.failed_over_from)}."
    if failure:
        text += f" It then failed: {failure}."
    return text
