"""The What-if page's tier parts (issue 49, item 4): hits by tier from a report whose settings
tried host memory and disk sizes, and the curve of hit rate against a tier's size."""

from __future__ import annotations

import pytest

from client.types import WhatIfReport
from dashboard.figures.whatif import (
    has_tiers,
    results_frame,
    tier_curve_figure,
    tier_curves,
    tier_table,
)
from tests.dashboard.bodies import body
from tests.dashboard.test_whatif_figures import REPORT, result

GIB = 1 << 30


def tiered(label, host_gib, disk_gib, hit_tokens, host_hits, disk_hits) -> dict:
    changes = {"host_cache_bytes": host_gib * GIB}
    if disk_gib:
        changes["disk_cache_bytes"] = disk_gib * GIB
    return result(label, changes, hit_tokens, hit_tokens - 400) | {
        "host_hit_tokens": host_hits,
        "disk_hit_tokens": disk_hits,
    }


TIERED = REPORT | {
    "results": [
        tiered("host 4 GiB, disk 1 TiB", 4, 1024, 760, 200, 160),
        tiered("host 4 GiB, disk 256 GiB", 4, 256, 700, 200, 100),
        tiered("host 16 GiB", 16, 0, 650, 250, 0),
        tiered("host 4 GiB", 4, 0, 600, 200, 0),
        tiered("host 1 GiB", 1, 0, 450, 50, 0),
        result("lru", {"eviction": "lru"}, 380, -20, eviction="lru"),
    ]
}


def test_hits_by_tier_add_up_to_each_settings_hits():
    frame = results_frame(body(WhatIfReport, TIERED))
    assert has_tiers(frame) and not has_tiers(results_frame(body(WhatIfReport, REPORT)))
    table = tier_table(frame)
    assert list(table["setting"])[:2] == ["host 4 GiB, disk 1 TiB", "host 4 GiB, disk 256 GiB"]
    row = table[table["setting"] == "host 4 GiB, disk 1 TiB"].iloc[0]
    assert (row["from device"], row["from host"], row["from disk"]) == (400, 200, 160)
    assert (row["host GiB"], row["disk GiB"]) == (4, 1024)
    as_ran = table[table["setting"] == "as ran"].iloc[0]
    assert (as_ran["from device"], as_ran["from host"], as_ran["host GiB"]) == (400, 0, 0)


def test_each_tier_has_a_curve_of_the_settings_that_vary_it_alone():
    curves = tier_curves(results_frame(body(WhatIfReport, TIERED)))
    # host: what ran (none), 1, 4 and 16 GiB, no disk; "lru" changes another field
    assert list(curves["host"]["host_cache_bytes"]) == [0, GIB, 4 * GIB, 16 * GIB]
    assert list(curves["host"]["hit_tokens"]) == [400, 450, 600, 650]
    # disk: none, 256 GiB and 1 TiB, each under 4 GiB of host memory
    assert list(curves["disk"]["disk_cache_bytes"]) == [0, 256 * GIB, 1024 * GIB]
    figure = tier_curve_figure(results_frame(body(WhatIfReport, TIERED)))
    lines = {trace.name: trace for trace in figure.data}
    assert list(lines["host: hit rate"].x) == [0, 1, 4, 16]
    assert list(lines["host: served by host"].y) == pytest.approx([0.0, 0.05, 0.2, 0.25])
    assert list(lines["disk: served by disk"].y) == pytest.approx([0.0, 0.1, 0.16])
    assert tier_curves(results_frame(body(WhatIfReport, REPORT))) == {}
