"""The rough edges a new user found (issue 16), on the figure builders and grid layout."""

from __future__ import annotations

import colorsys

import pandas as pd

from client.types import BenchmarkRunOut, BlockGrid, EngineDetail, HitRateOut
from dashboard.figures.benchmarks import modes_frame, modes_table
from dashboard.figures.block_grid import CATEGORY_COLORS, block_grid_figure
from dashboard.figures.cache_usage import usage_text
from dashboard.figures.hit_rate import hit_rate_figure, hit_rate_frame
from dashboard.grid.arrows import MAX_ARROWS, arrows, link_frame
from dashboard.grid.cells import grid_cells
from tests.dashboard.bodies import body
from tests.dashboard.test_figures import COPY, HIT_RATE, ROWS, grid_columns


def test_a_never_used_free_block_says_so():
    cells = grid_cells(body(BlockGrid, grid_columns(ROWS, stop=8)))
    hover = cells.frame["hover"].tolist()
    assert hover[4] == "block 4 · free, never used"  # no row: no event ever touched it
    assert all(isinstance(h, str) and h for h in hover)
    fig = block_grid_figure(cells.frame, cells.width)
    assert "block 7 · free, never used" in [t for row in fig.data[0].text for t in row]


def test_copy_on_write_targets_are_not_drawn_in_red():
    red, green, blue = (
        int(CATEGORY_COLORS["copy-on-write target"][i : i + 2], 16) for i in (1, 3, 5)
    )
    hue, _, saturation = colorsys.rgb_to_hls(red / 255, green / 255, blue / 255)
    assert not (saturation > 0.3 and (hue < 30 / 360 or hue > 330 / 360))


def many_copies(num: int) -> list[dict]:
    """`num` copies between the cells of 64 blocks: 32 pairs, each some times over."""
    return [
        {**COPY, "src": i % 32, "dst": 32 + i % 32, "request_id": f"r{i % 3}", "seq": i}
        for i in range(num)
    ]


def test_arrows_are_aggregated_and_capped():
    grid = grid_columns([(i, "cached", False, "block") for i in range(64)], stop=64)
    grid["links"] = many_copies(200)
    grid = body(BlockGrid, grid)
    cells = grid_cells(grid)
    links = link_frame(grid, cells)
    drawn = arrows(links)
    assert len(drawn.frame) == MAX_ARROWS
    assert drawn.num_links == 200
    assert drawn.num_hidden == 200 - drawn.frame["num_links"].sum() > 0
    assert not drawn.frame.duplicated(["kind", "src_cell", "dst_cell"]).any()
    assert drawn.frame["seq"].tolist() == sorted(drawn.frame["seq"])  # the newest, last
    assert drawn.frame["seq"].iloc[-1] == 199
    fig = block_grid_figure(cells.frame, cells.width, links=drawn.frame)
    (copy,) = [t for t in fig.data if t.name == "copy (src → dst)"]
    assert list(copy.x).count(None) == MAX_ARROWS
    # a request's own links alone
    own = arrows(links, "r1")
    assert own.num_links == len(links[links["request_id"] == "r1"])
    assert set(own.frame["src_cell"]) <= set(links[links["request_id"] == "r1"]["src_cell"])
    assert arrows(links, "nobody").num_links == 200  # an unknown request: all of them


def test_the_overall_hit_line_stays_visible_over_an_equal_group_line():
    frame = hit_rate_frame(body(HitRateOut, HIT_RATE))
    fig = hit_rate_figure(frame)
    overall = fig.data[-1]  # drawn last: on top
    mamba = next(t for t in fig.data if t.name == "mamba")
    assert overall.name == "overall" and list(overall.y) == list(mamba.y)
    assert overall.line.dash == "dash" and overall.line.width > mamba.line.width
    assert overall.legendrank < mamba.legendrank  # still first in the legend


def test_usage_says_what_it_means_beside_the_cached_blocks():
    engine = {
        "cache": {
            "attention": {
                "num_blocks": 320,
                "num_free": 139,
                "num_cached": 147,
                "num_in_use": 0,
                "num_pinned": 34,
                "usage": 0.10625,
            },
        }
    }
    text = usage_text(body(EngineDetail, engine))
    assert "blocks in use or pinned / all blocks" in text
    assert "attention 10.6% (34 of 320)" in text
    assert "attention 147" in text and "eviction" in text


def test_the_benchmark_table_reads_in_percent_with_human_headers():
    run = {
        "results": {
            "modes": [
                {
                    "mode": "off",
                    "num_requests": 8,
                    "hit_rate": 0.0,
                    "oracle_hit_rate": 0.6171428571428571,
                    "throughput_tok_s": 723822.025729171,
                    "ttft_median_s": 0.0003355741500854492,
                    "wall_s": 0.003912563999620033,
                },
            ]
        }
    }
    table = modes_table(modes_frame(body(BenchmarkRunOut, run)))
    assert "hit_rate" not in table and all("_" not in c for c in table.columns)
    row = table.iloc[0]
    assert row["hit rate (%)"] == 0.0 and row["oracle hit rate (%)"] == 61.7
    assert row["throughput (tokens/s)"] == 723822
    assert row["TTFT median (ms)"] == 0.34 and pd.isna(row["TTFT p99 (ms)"])
    assert row["requests"] == 8
