"""Remedies: for each reason tokens missed (`dashboard.figures.attribution`), what would fix
it and what it would have saved. Pure functions of the attribution, the engine's hello geometry
and its cache usage."""

from __future__ import annotations

from typing import NamedTuple

from client.schema import ATTENTION, MAMBA, CacheGeometry
from client.types import GroupUsage, JunctionOut
from dashboard.figures.reasons import REASONS

CHECKPOINTS_PAGE = "views/checkpoints.py"
CHECKPOINTS_LINK = "Checkpoints: suggested junctions and the pin form"
POOL_FLAGS = {ATTENTION: "--num-blocks", MAMBA: "--num-mamba-blocks"}
#: the tier each eviction reason names, and the flag that sizes it
TIER_FLAGS = {
    "evicted_host": ("host", "--host-cache-bytes"),
    "evicted_disk": ("disk", "--disk-cache-bytes"),
}
TIER_REASONS = (*TIER_FLAGS, "evicted_shared", "not_admitted")


class Action(NamedTuple):
    """One thing to do about a reason."""

    text: str  # markdown: what to do, and why it helps
    page: str | None = None  # the dashboard page that does it (`st.page_link`), if any
    page_label: str = ""  # the link's text


class Remedy(NamedTuple):
    """A reason that missed tokens, what would fix it, and what it would have saved."""

    reason: str  # a key of `REASONS`
    num_tokens: int  # the tokens that reason missed: what the remedy would have saved
    share: float  # of the prompt tokens (0 with none)
    actions: tuple[Action, ...]


def remedies(
    missed: dict[str, int],
    num_prompt_tokens: int,
    geometry: CacheGeometry,
    cache: dict[str, GroupUsage] | None = None,
    boundary: int | None = None,
    junction: JunctionOut | None = None,
) -> list[Remedy]:
    """The remedy for each reason that missed tokens, most tokens first. `geometry` is the
    engine's hello geometry, `cache` its usage per group (`GET /engines/{id}`), `boundary`
    one request's attention match (None: a window of requests) and `junction` the suggested
    junction there (`GET /junctions/suggested`), if the control plane suggests one."""
    found = [
        Remedy(reason, tokens, tokens / num_prompt_tokens if num_prompt_tokens else 0.0, actions)
        for reason, tokens in missed.items()
        if tokens > 0 and (actions := _actions(reason, geometry, cache or {}, boundary, junction))
    ]
    return sorted(found, key=lambda r: (-r.num_tokens, list(REASONS).index(r.reason)))


def _actions(
    reason: str,
    geometry: CacheGeometry,
    cache: dict[str, GroupUsage],
    boundary: int | None,
    junction: JunctionOut | None,
) -> tuple[Action, ...]:
    junctions_off = geometry.junction_checkpoints is False
    where = f"this boundary (token {boundary:,})" if boundary is not None else "these boundaries"
    listed = "lists each suggested junction"
    if junction is not None:
        num = junction.num_requests
        listed = (
            f"suggests this one ({num:,} {'request' if num == 1 else 'requests'} matched it; "
            f"a pin would have saved them {junction.tokens_saved:,} tokens)"
        )
    pin = Action(
        f"**Pin {where}**: the Checkpoints page {listed} with a preview of its text and a "
        "*Pin it* button.",
        CHECKPOINTS_PAGE,
        CHECKPOINTS_LINK,
    )
    if reason == "no_state":
        if junctions_off:
            return pin, _turn_on_junctions(
                "they keep the Mamba state where a request leaves the cached prefix"
            )
        return (pin,)
    if reason == "evicted":
        return (*_pool_actions(geometry, cache), _pin_prefix("so it is never evicted"))
    if reason in TIER_REASONS:
        return _tier_actions(reason, geometry)
    if reason == "restarted":
        return (
            Action(
                "**Nothing to enlarge**: the engine restarted; its cache was empty, so the "
                "first requests after it recomputed what it held before, and the cache fills "
                "again as they come. Larger pools would not have kept it."
            ),
            _pin_prefix("the control plane pins it again on each engine start"),
        )
    if reason == "in_flight":
        if junctions_off:
            return (
                _turn_on_junctions(
                    "they also turn on in-flight sharing, so a request waits for the one "
                    "computing its prefix instead of computing it again"
                ),
            )
        wait = geometry.max_prefix_wait_steps
        if wait is not None:
            return (
                Action(
                    f"**Raise `--max-prefix-wait-steps`** (now {wait}): in-flight sharing is "
                    "on, but these requests stopped waiting for the request computing their "
                    "prefix before it registered it."
                ),
                _pin_prefix("so a burst finds it cached"),
            )
        return (_pin_prefix("so a burst finds it cached"),)
    if reason == "held_back":
        eagle = " and, with EAGLE on here, every hit drops one unit for the drafts" * bool(
            geometry.eagle
        )
        unit = geometry.prefix_match_unit
        return (
            Action(
                f"**By design**: an exact resend recomputes its last match unit"
                f"{f' ({unit} tokens)' if unit else ''} for the next token's logits{eagle}; "
                "no cache setting saves it."
            ),
            _pin_prefix("so resends of it still hit up to the pin"),
        )
    return ()


def _tier_actions(reason: str, geometry: CacheGeometry) -> tuple[Action, ...]:
    """A miss a tier below the device explains: enlarge that tier (its flag and size now), or
    the shared store's TTL and bound, or room in the tiers for what none took; or a pin."""
    if reason in TIER_FLAGS:
        return (_tier_action(reason, geometry), _pin_prefix("so it is never evicted"))
    if reason == "evicted_shared":
        return (
            Action(
                "**Lengthen the shared store's TTL or raise its byte bound**: it gave this "
                "prefix up before the request came."
            ),
            _pin_prefix("so it is never evicted"),
        )
    host = (geometry.tier_bytes or {}).get("host")
    size = f" (now {host:,} bytes)" if host is not None else ""
    return (
        Action(
            f"**Give the tiers room for it** (`--host-cache-bytes`{size}, or a disk tier: "
            "`--disk-cache-dir` with `--disk-cache-bytes`): the device gave the prefix up "
            "and no tier took it, too small for its unit or full of others."
        ),
        _pin_prefix("so the device keeps it"),
    )


def _tier_action(reason: str, geometry: CacheGeometry) -> Action:
    """Enlarge the tier that gave the prefix up, naming its flag and its size now."""
    tier, flag = TIER_FLAGS[reason]
    size = (geometry.tier_bytes or {}).get(tier)
    now = f" (now {size:,} bytes)" if size is not None else ""
    return Action(
        f"**Enlarge the {tier} tier** (`{flag}`{now}): it gave the prefix up before the "
        "request came, to make room for others."
    )


def _turn_on_junctions(why: str) -> Action:
    return Action(
        "**Turn on junction checkpoints** (`junction serve --junction-checkpoints`; this "
        f"engine runs with them off): {why}."
    )


def _pin_prefix(why: str) -> Action:
    return Action(f"**Pin the shared prefix** ({why}).", CHECKPOINTS_PAGE, CHECKPOINTS_LINK)


def _pool_actions(geometry: CacheGeometry, cache: dict[str, GroupUsage]) -> list[Action]:
    """Enlarge a pool: the fullest first (least free, from `cache`), each with its size."""
    groups = geometry.groups or {}

    def free_share(group: str) -> float:
        usage = cache.get(group)
        return usage.num_free / usage.num_blocks if usage and usage.num_blocks else 1.0

    actions = []
    for group in sorted(groups, key=free_share):
        pool = groups[group]
        flag = POOL_FLAGS.get(group, f"the {group} pool's size")
        usage = cache.get(group)
        free = f", {usage.num_free:,} free now" if usage else ""
        actions.append(
            Action(
                f"**Enlarge the {group} pool** (`{flag}`): {pool.num_blocks or 0:,} blocks "
                f"of {pool.block_size} tokens{free}."
            )
        )
    return actions
