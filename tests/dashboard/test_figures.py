"""The figure builders and the grid layout, on data frames and hand-made grid columns."""

from __future__ import annotations

import pandas as pd
import pytest

from client.types import BenchmarkRunOut, BlockGrid, EngineDetail, HitRateOut, RequestOut
from dashboard.figures.benchmarks import hit_rate_by_mode_figure, modes_frame, ttft_by_mode_figure
from dashboard.figures.block_grid import CATEGORY_COLORS, block_grid_figure, discrete_colorscale
from dashboard.figures.cache_usage import STATE_COLORS, cache_usage_figure, cache_usage_frame
from dashboard.figures.chunks import REASON_COLORS, chunk_frame, chunk_timeline_figure
from dashboard.figures.hit_rate import hit_rate_figure, hit_rate_frame, requests_rate_figure
from dashboard.grid.arrows import link_frame
from dashboard.grid.blocks import block_frame
from dashboard.grid.categories import CATEGORIES, COW_TARGET, PINNED
from dashboard.grid.cells import grid_cells
from dashboard.grid.outline import request_outline
from tests.dashboard.bodies import body


def grid_columns(rows: list[tuple], stop: int, links: list[dict] = (), keys: bool = True) -> dict:
    """The block-grid endpoint's body for rows `(block_id, state, is_partial, reason)`."""
    states = ["free", "cached", "in_use", "pinned"]
    reasons = ["block", "resend", "extension", "junction", "pin"]
    return {
        "start": 0,
        "stop": stop,
        "states": states,
        "reasons": reasons,
        "block_id": [r[0] for r in rows],
        "state": [states.index(r[1]) for r in rows],
        "is_partial": [r[2] for r in rows],
        "ref_cnt": [1 if r[1] == "in_use" else 0 for r in rows],
        "token_start": [16 * r[0] for r in rows],
        "token_end": [16 * r[0] + (8 if r[2] else 16) for r in rows],
        "checkpoint_reason": [None if r[3] is None else reasons.index(r[3]) for r in rows],
        "last_change": [7 for _ in rows],
        "keys": [[f"{r[0]:032x}"] for r in rows] if keys else None,
        "links": list(links),
    }


ROWS = [
    (0, "pinned", False, "pin"),
    (1, "cached", False, "block"),
    (2, "cached", True, "resend"),
    (3, "in_use", False, None),
    (5, "in_use", True, "junction"),
]
COPY = {
    "kind": "copy",
    "src": 2,
    "dst": 5,
    "path": "consumer",
    "request_id": "r",
    "step": 3,
    "seq": 9,
}


def test_block_frame_gives_each_block_a_category():
    frame = block_frame(body(BlockGrid, grid_columns(ROWS, stop=8, links=[COPY])))
    names = [CATEGORIES[c] for c in frame["category"]]
    assert names == [
        "pinned",
        "cached full",
        "cached partial",
        "in use",
        "free",  # block 4 has no row: never reported, free
        "copy-on-write target",  # in use, and the destination of a copy
        "free",
        "free",
    ]
    assert frame.loc[2, "checkpoint_reason"] == "resend"
    assert frame.loc[2, "keys"] == f"{2:032x}"[:12]


def test_cells_one_block_each_with_hover_details():
    cells = grid_cells(body(BlockGrid, grid_columns(ROWS, stop=8, links=[COPY])))
    assert not cells.is_aggregated and len(cells.frame) == 8
    hover = cells.frame.loc[2, "hover"]
    for part in ("block 2", "cached partial", "tokens [32, 40)", "checkpoint resend", "refs 0"):
        assert part in hover
    assert "last change: step 7" in hover and "keys 000000000000" in hover


def test_aggregated_cells_keep_the_most_notable_state_and_count_the_rest():
    """The endpoint's counts for 1000 blocks at 10 a cell: blocks 0-99 cached (57 pinned,
    55 partial), block 73 in use and the destination of a copy; the rest never reported."""
    counted = {
        "cell": list(range(10)),
        "num_pinned": [0] * 5 + [1] + [0] * 4,
        "num_in_use": [0] * 7 + [1] + [0] * 2,
        "num_cached_full": [10] * 5 + [8, 10, 9, 10, 10],
        "num_cached_partial": [0] * 5 + [1] + [0] * 4,
    }
    grid = {
        "start": 0,
        "stop": 1000,
        "blocks_per_cell": 10,
        "cells": counted,
        "links": [{**COPY, "src": 12, "dst": 73, "dst_state": "in_use", "dst_is_partial": False}],
    }
    cells = grid_cells(body(BlockGrid, grid))
    assert cells.is_aggregated and cells.blocks_per_cell == 10 and len(cells.frame) == 100
    shown = [CATEGORIES[c] for c in cells.frame["category"][:11]]
    assert shown == ["cached full"] * 5 + ["pinned", "cached full", "copy-on-write target"] + [
        "cached full"
    ] * 2 + ["free"]
    hover = cells.frame["hover"]
    assert hover[5] == "blocks 50-59<br>8 cached full<br>1 cached partial<br>1 pinned"
    assert hover[7] == "blocks 70-79<br>9 cached full<br>1 copy-on-write target"
    assert hover[99] == "blocks 990-999<br>10 free"
    assert cells.cell_of(57) == 5 and cells.cell_of(1000) is None


def test_links_and_request_outline_map_blocks_to_cells():
    grid = body(BlockGrid, grid_columns(ROWS, stop=8, links=[COPY]))
    cells = grid_cells(grid)
    links = link_frame(grid, cells)
    assert links[["src_cell", "dst_cell"]].values.tolist() == [[2, 5]]
    outline, boundary = request_outline([0, 1, 5], hit=40, block_size=16, cells=cells)
    assert outline["cell"].tolist() == [0, 1, 5]
    assert boundary.iloc[0][["block_id", "hit"]].tolist() == [5, 40]
    assert boundary.iloc[0]["frac"] == pytest.approx(0.5)  # token 40 is halfway into block 2
    # a hit at the end of the table: the right edge of the last block
    _, end = request_outline([0, 1], hit=32, block_size=16, cells=cells)
    assert end.iloc[0]["block_id"] == 1 and end.iloc[0]["frac"] == 1.0


def test_block_grid_figure_colours_every_state_and_draws_overlays():
    grid = body(BlockGrid, grid_columns(ROWS, stop=8, links=[COPY]))
    cells = grid_cells(grid)
    outline, boundary = request_outline([0, 1, 5], hit=40, block_size=16, cells=cells)
    fig = block_grid_figure(
        cells.frame,
        cells.width,
        links=link_frame(grid, cells),
        outline=outline,
        boundary=boundary,
    )
    heatmap = fig.data[0]
    assert heatmap.type == "heatmap"
    assert list(heatmap.colorbar.ticktext) == list(CATEGORIES)
    colours = [color for _, color in discrete_colorscale()]
    assert set(colours) == set(CATEGORY_COLORS.values()) and len(set(colours)) == len(CATEGORIES)
    # category i is painted with its own colour: z = i falls in the i-th flat band
    n = len(CATEGORIES)
    for i, name in enumerate(CATEGORIES):
        low, high = heatmap.colorscale[2 * i], heatmap.colorscale[2 * i + 1]
        assert low[0] <= (i + 0.5) / n <= high[0] and low[1] == high[1] == CATEGORY_COLORS[name]
    assert heatmap.z[0][0] == PINNED and heatmap.z[0][5] == COW_TARGET
    names = [trace.name for trace in fig.data]
    assert names == ["blocks", "copy (src → dst)", "request's blocks", "hit boundary (token 40)"]
    assert fig.layout.yaxis.title.text == "block id at the row's start"
    assert "block offset" in fig.layout.xaxis.title.text


HIT_RATE = {
    "buckets": [
        {
            "bucket_start": 1_800_000_000,
            "bucket_s": 60,
            "num_requests": 30,
            "prompt_tokens": 1000,
            "cached_tokens": 250,
            "hit_rate": 0.25,
            "hit_rate_by_group": {"attention": 0.5, "mamba": 0.25},
        },
        {
            "bucket_start": 1_800_000_060,
            "bucket_s": 60,
            "num_requests": 60,
            "prompt_tokens": 1000,
            "cached_tokens": 750,
            "hit_rate": 0.75,
            "hit_rate_by_group": {"attention": 0.8, "mamba": 0.75},
        },
    ]
}


def test_hit_rate_figures():
    frame = hit_rate_frame(body(HitRateOut, HIT_RATE))
    fig = hit_rate_figure(frame)
    assert [t.name for t in fig.data] == ["attention", "mamba", "overall"]  # overall on top
    assert list(fig.data[2].y) == [0.25, 0.75]
    assert fig.layout.yaxis.tickformat == ".0%"
    assert fig.layout.yaxis.title.text == "token hit rate (%)"
    rate = requests_rate_figure(frame)
    assert list(rate.data[0].y) == [0.5, 1.0]
    assert rate.layout.yaxis.title.text == "requests/s"


def test_a_bucket_of_a_few_tokens_is_a_small_marker_that_says_how_few():
    """One 27-token request that hit nothing beside 3,000 tokens at 75%: its 0% is a speck,
    and the hover says it is 27 tokens of 1 request."""
    buckets = [dict(HIT_RATE["buckets"][1], prompt_tokens=3000)]
    buckets.append(
        dict(
            HIT_RATE["buckets"][0],
            bucket_start=1_800_000_120,
            num_requests=1,
            prompt_tokens=27,
            cached_tokens=0,
            hit_rate=0.0,
            hit_rate_by_group={"attention": 0.0, "mamba": 0.0},
        )
    )
    fig = hit_rate_figure(hit_rate_frame(body(HitRateOut, {"buckets": buckets})))
    for trace in fig.data:
        big, small = trace.marker.size
        assert small < big / 2, trace.name
        assert [list(point) for point in trace.customdata] == [[3000, 60], [27, 1]]
        assert "prompt tokens" in trace.hovertemplate and "requests" in trace.hovertemplate


def test_cache_usage_figure_stacks_states_per_group():
    engine = {
        "cache": {
            "attention": {
                "num_blocks": 100,
                "num_free": 50,
                "num_cached": 20,
                "num_in_use": 25,
                "num_pinned": 5,
            },
            "mamba": {
                "num_blocks": 10,
                "num_free": 10,
                "num_cached": 0,
                "num_in_use": 0,
                "num_pinned": 0,
            },
        }
    }
    fig = cache_usage_figure(cache_usage_frame(body(EngineDetail, engine)))
    assert [t.name for t in fig.data] == ["free", "cached", "in use", "pinned"]
    assert [t.marker.color for t in fig.data] == list(STATE_COLORS.values())
    assert list(fig.data[3].x) == [5, 0] and list(fig.data[3].y) == ["attention", "mamba"]
    assert fig.layout.barmode == "stack" and fig.layout.xaxis.title.text == "blocks"


def test_chunk_timeline_colours_each_stop_reason():
    request = {
        "num_cached_tokens": 512,
        "chunks": [[512, 560], [560, 1024], [1024, 1030]],
        "chunk_stop_reasons": ["pin", "block_boundary", "end"],
    }
    frame = chunk_frame(body(RequestOut, request))
    assert frame["label"].tolist() == ["hit", "chunk 1", "chunk 2", "chunk 3"]
    fig = chunk_timeline_figure(frame)
    assert [t.name for t in fig.data] == ["cached (hit)", "pin", "block_boundary", "end"]
    assert [t.marker.color for t in fig.data] == [
        REASON_COLORS[n] for n in ("cached (hit)", "pin", "block_boundary", "end")
    ]
    pin = fig.data[1]
    assert list(pin.base) == [512] and list(pin.x) == [48]
    assert fig.layout.xaxis.title.text == "prompt position (tokens)"


def test_benchmark_figures_against_the_oracle():
    run = {
        "results": {
            "modes": [
                {"mode": "off", "hit_rate": 0.0, "oracle_hit_rate": 0.6, "ttft_median_s": 0.01},
                {"mode": "pins", "hit_rate": 0.6, "oracle_hit_rate": 0.6, "ttft_p99_s": 0.002},
            ]
        }
    }
    frame = modes_frame(body(BenchmarkRunOut, run))
    assert isinstance(frame, pd.DataFrame) and frame["mode"].tolist() == ["off", "pins"]
    fig = hit_rate_by_mode_figure(frame)
    assert [t.name for t in fig.data] == ["hit rate", "oracle"]
    assert list(fig.data[1].y) == [0.6, 0.6]
    ttft = ttft_by_mode_figure(frame)
    assert [t.name for t in ttft.data] == ["median", "p99"]
    assert ttft.data[0].y[0] == pytest.approx(10.0) and ttft.data[1].y[1] == pytest.approx(2.0)
    assert ttft.layout.yaxis.title.text == "TTFT (ms)"
