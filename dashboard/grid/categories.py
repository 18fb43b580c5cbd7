"""What a block of the grid is, in rising notability: free, cached full, cached partial, in use,
copy-on-write target, pinned. A cell standing for several blocks shows the most notable
category among them."""

from __future__ import annotations

#: Categories in rising notability: an aggregated cell shows the highest of its blocks'.
CATEGORIES = (
    "free",
    "cached full",
    "cached partial",
    "in use",
    "copy-on-write target",
    "pinned",
)
FREE, CACHED_FULL, CACHED_PARTIAL, IN_USE, COW_TARGET, PINNED = range(len(CATEGORIES))


def category_of(state: str, is_partial: bool) -> int:
    if state == "pinned":
        return PINNED
    if state == "in_use":
        return IN_USE
    if state == "cached":
        return CACHED_PARTIAL if is_partial else CACHED_FULL
    return FREE
