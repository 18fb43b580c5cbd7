"""How miss attribution reads and looks: the hit, the shared tokens (the online oracle) and
each reason shared tokens missed the cache, with its label, colour and meaning; and why a
request's hit stopped where it did. The attribution figures, tables and remedies all name a
reason through these.

hit + sum(missed by reason) = shared tokens, per request and per bucket.
"""

from __future__ import annotations

from typing import NamedTuple


class Series(NamedTuple):
    """How one series of the attribution reads and looks."""

    label: str  # its name in legends and tables
    color: str  # never red: no reason is an error
    short: str  # a few words, beside the label in the legend
    meaning: str  # one sentence, in tooltips and the reasons' table


HIT = Series("hit", "#2a9d5c", "served from the cache", "Tokens the cache served.")
SHARED = Series(
    "shared (oracle)",
    "#1b1b1b",
    "what was truly shared",
    "The longest prefix each request shared with an earlier request in the retention window "
    "or a pin: what a cache that kept everything could have hit (hit + missed).",
)
UNSHARED = Series(
    "not shared",
    "#d9d9d9",
    "new to the cache",
    "Prompt tokens no earlier request or pin shared: no cache could have hit them.",
)
#: Why shared tokens missed, in stacking order (`attribution.missed_tokens`' keys).
REASONS: dict[str, Series] = {
    "no_state": Series(
        "no state",
        "#8e6cc4",
        "no Mamba state at the match",
        "The recurrent (Mamba) state was missing at or below the attention match: a junction "
        "checkpoint or a pin there would have kept it.",
    ),
    "in_flight": Series(
        "in flight",
        "#f0a202",
        "being computed by another request",
        "Another request in flight was computing those blocks and had not registered them yet.",
    ),
    "held_back": Series(
        "held back",
        "#3aa6a6",
        "one unit held back (resend, EAGLE)",
        "The hit was held one match unit back: an exact resend recomputes its last unit for "
        "the next token's logits, and EAGLE drafts need the last unit's hidden states.",
    ),
    "evicted": Series(
        "evicted",
        "#a67c52",
        "removed before the request came",
        "The prefix had been cached and was evicted before this request came.",
    ),
    "evicted_host": Series(
        "host eviction",
        "#c98a4b",
        "host memory gave it up before the request came",
        "The prefix went down from the device into host memory, which gave it up (to make room) "
        "before this request came: a bigger host tier would have kept it.",
    ),
    "evicted_disk": Series(
        "disk eviction",
        "#7a5230",
        "the disk tier gave it up before the request came",
        "The prefix went down to the disk tier, which gave it up before this request came: a "
        "bigger disk tier would have kept it.",
    ),
    "evicted_shared": Series(
        "shared eviction",
        "#5c4a3d",
        "the shared store gave it up (its TTL or its bound)",
        "The prefix was in the fleet's shared store, which gave it up (its TTL ran out, or its "
        "byte bound took it) before this request came.",
    ),
    "not_admitted": Series(
        "not admitted below",
        "#d4b483",
        "evicted from the device; no tier below took it",
        "The device gave the prefix up and no tier below it took it: a tier too small for it, "
        "a state whose attention was gone (unbacked), or one the eviction policy declined.",
    ),
    "restarted": Series(
        "restarted",
        "#5b7db1",
        "the engine restarted; its cache was empty",
        "The prefix had been cached before the engine restarted: a restart starts with an "
        "empty cache, so the first requests after it recompute what the engine held before.",
    ),
    "copy_pending": Series(
        "copy pending",
        "#9aa5b1",
        "waited for a copy (0 tokens)",
        "A checkpoint's copy was pending: the engine waits a step for it instead of missing, "
        "so this counts steps, never tokens.",
    ),
}
#: Why a request's hit stopped where it did (`attribution.stop_reason`), in plain words.
STOP_REASONS = {
    "attention_ended": "the attention match ended: nothing more was cached",
    "no_state": "no Mamba state was kept at the attention match",
    "in_flight": "a request in flight was still computing the rest",
    "held_back": "the hit was held one match unit back (resend or EAGLE)",
}
STOP_LABELS = {
    "attention_ended": "match ended",
    "no_state": "no state",
    "in_flight": "in flight",
    "held_back": "held back",
}
