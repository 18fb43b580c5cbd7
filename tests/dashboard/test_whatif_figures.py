"""The What-if page's pure parts: the report as a frame, the curve of hit rate against memory,
the ranked table, the agreement line, and the form's settings."""

from __future__ import annotations

import pytest

from client.schema import CacheGeometry
from client.types import WhatIfReport
from dashboard.figures.whatif import (
    agreement_text,
    curve_families,
    curve_figure,
    ranked_table,
    results_frame,
    settings_text,
)
from dashboard.forms.whatif import Choices, build_settings, memory_setting, offered, parse_extra
from tests.dashboard.bodies import body

RAN = {"num_blocks": 100, "num_mamba_blocks": 20, "eviction": "reuse", "block_size": 16}


def result(label, changes, hit_tokens, gain, **config) -> dict:
    return {
        "label": label,
        "changes": changes,
        "config": RAN | config,
        "num_prompt_tokens": 1000,
        "hit_tokens": hit_tokens,
        "oracle_tokens": 800,
        "bound_tokens": 700,
        "hit_rate": hit_tokens / 1000,
        "share_of_oracle": hit_tokens / 800,
        "share_of_bound": hit_tokens / 700,
        "gain_tokens": gain,
    }


REPORT = {
    "num_requests": 12,
    "num_prompt_tokens": 1000,
    "recorded_tokens": 400,
    "agreement": 12,
    "exact": True,
    "as_ran": {k: v for k, v in result("as ran", {}, 400, 0).items() if k != "gain_tokens"},
    "results": [  # as `WhatIfReport.as_dict` ranks them: most tokens saved first
        result("memory ×2", {"num_blocks": 200, "num_mamba_blocks": 40}, 600, 200,
               num_blocks=200, num_mamba_blocks=40),
        result("lru, memory ×2", {"eviction": "lru", "num_blocks": 200, "num_mamba_blocks": 40},
               550, 150, num_blocks=200, num_mamba_blocks=40, eviction="lru"),
        result("lru", {"eviction": "lru"}, 380, -20, eviction="lru"),
        result("as vLLM would", {"mode": "vllm"}, 100, -300),
        result("memory ×0.5", {"num_blocks": 50, "num_mamba_blocks": 10}, 200, -200,
               num_blocks=50, num_mamba_blocks=10),
    ],
}  # fmt: skip


def test_the_frame_has_a_row_per_setting_what_ran_first():
    frame = results_frame(body(WhatIfReport, REPORT))
    assert list(frame["setting"]) == [
        "as ran",
        "memory ×2",
        "lru, memory ×2",
        "lru",
        "as vLLM would",
        "memory ×0.5",
    ]
    assert list(frame["memory"]) == [1.0, 2.0, 2.0, 1.0, 1.0, 0.5]
    assert list(frame["family"]) == [
        "as ran",
        "as ran",
        "eviction lru",
        "eviction lru",
        "mode vllm",
        "as ran",
    ]
    assert frame["is_as_ran"].tolist() == [True] + [False] * 5
    assert results_frame(WhatIfReport()).empty


def test_the_curve_draws_the_families_tried_at_several_memories():
    frame = results_frame(body(WhatIfReport, REPORT))
    assert curve_families(frame) == ["as ran", "eviction lru"]
    fig = curve_figure(frame)
    assert [(t.name, t.mode) for t in fig.data] == [
        ("as ran", "lines+markers"),
        ("eviction lru", "lines+markers"),
        ("what ran", "markers"),  # the star
    ]
    as_ran, lru, star = fig.data
    assert list(as_ran.x) == [0.5, 1.0, 2.0] and list(as_ran.y) == [0.2, 0.4, 0.6]
    assert list(lru.x) == [1.0, 2.0] and list(lru.y) == [0.38, 0.55]
    assert list(star.x) == [1.0] and list(star.y) == [0.4]
    assert fig.layout.xaxis.type == "log"
    flat = results_frame(body(WhatIfReport, REPORT | {"results": REPORT["results"][2:4]}))
    assert curve_families(flat) == []


def test_the_table_ranks_by_tokens_saved_with_what_ran_at_zero():
    table = ranked_table(results_frame(body(WhatIfReport, REPORT)))
    assert list(table["setting"]) == [
        "memory ×2",
        "lru, memory ×2",
        "as ran",
        "lru",
        "memory ×0.5",
        "as vLLM would",
    ]
    assert list(table["gain vs as ran"]) == [200, 150, 0, -20, -200, -300]
    first = table.iloc[0]
    assert first["hit tokens"] == 600 and first["% of oracle"] == pytest.approx(75.0)
    assert first["% of bound"] == pytest.approx(600 / 7)
    assert ranked_table(results_frame(WhatIfReport())).empty


def test_the_agreement_line():
    assert agreement_text(body(WhatIfReport, REPORT)) == (
        "Replaying its own settings reproduces 12 of 12 requests' hits (400 hit tokens "
        "replayed, 400 recorded): exact."
    )
    partial = REPORT | {"agreement": 9, "exact": False}
    assert agreement_text(body(WhatIfReport, partial)).startswith(
        "Replaying its own settings reproduces 9 of 12"
    )
    assert agreement_text(body(WhatIfReport, partial)).endswith("recorded).")
    assert settings_text([{"label": "x"}, {"eviction": "lru"}]) == 'x; {"eviction": "lru"}'


GEOMETRY = CacheGeometry.from_json(
    {
        "block_size": 16,
        "mamba_block_size": 512,
        "prefix_match_unit": 32,
        "eviction": "reuse",
        "groups": {
            "attention": {"block_size": 16, "num_blocks": 320},
            "mamba": {"block_size": 512, "num_blocks": 161},
        },
    }
)


def test_the_form_builds_the_settings_it_shows():
    assert offered((16, 32, 64, 100), GEOMETRY) == [32, 64]
    assert memory_setting(0.5, GEOMETRY) == {
        "label": "memory ×0.5",
        "num_blocks": 160,
        "num_mamba_blocks": 80,
    }
    choices = Choices(
        vllm=True,
        block_sizes=(64,),
        evictions=("lru", "reuse"),
        memory=(0.5, 2.0),
        extra=({"checkpoint_interval": 256},),
    )
    settings = build_settings(choices, GEOMETRY)
    labels = [s.get("label") for s in settings]
    assert labels == [
        "as vLLM would",
        None,
        "memory ×0.5",
        "memory ×2",
        "lru",
        "lru, memory ×0.5",
        "lru, memory ×2",
        "reuse, memory ×0.5",  # reuse is what ran: tried at other memories only
        "reuse, memory ×2",
        None,
    ]
    assert settings[1] == {"block_size": 64}
    assert settings[6] == {
        "label": "lru, memory ×2",
        "num_blocks": 640,
        "num_mamba_blocks": 322,
        "eviction": "lru",
    }
    assert build_settings(Choices(memory=(2.0, 2.0)), GEOMETRY) == [memory_setting(2, GEOMETRY)]


def test_the_json_box_takes_a_setting_or_a_list():
    assert parse_extra("") == ()
    assert parse_extra('{"eviction": "lru"}') == ({"eviction": "lru"},)
    assert parse_extra('[{"a": 1}, {}]') == ({"a": 1}, {})
    with pytest.raises(ValueError, match="JSON object"):
        parse_extra("[1]")
    with pytest.raises(ValueError):
        parse_extra("{")
