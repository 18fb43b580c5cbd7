"""`benchmarks/tiers.py`'s vLLM-with-offload target on hand-made peer cells (no peer needed):
the total over the offload cells and the worst cell, and "not checked" without the peer."""

from __future__ import annotations

from benchmarks.tiers import offload_lines, peer_targets
from benchmarks.tiers_peer import PeerCell

WHAT = ">= 1.5x vLLM-with-offload hit tokens at equal bytes"


def cell(host: int, vllm: int, ours: int, workload: str = "w", loaded: int = 3) -> PeerCell:
    return PeerCell(
        workload, 16, host, 10, 524288, host * 1000, host * 2, 5000, vllm, ours,
        int(host > 0), loaded if host else 0, 4 if host else 0,
    )  # fmt: skip


def test_the_total_and_every_cell_are_checked_over_the_offload_cells_only():
    cells = [cell(0, 100, 400), cell(2, 200, 400), cell(8, 300, 450)]
    rows = {what: (met, figure) for what, met, figure in peer_targets(cells)}
    assert rows[f"{WHAT}, in total (host 2x/8x, disk off)"] == (
        True,
        "1.70x (850 against 500 tokens)",
    )
    assert rows[f"{WHAT}, in every cell"] == (
        True,
        "2 of 2 cells met; worst 1.50x (w, c 16, host 8x)",
    )


def test_a_cell_below_the_target_misses_it():
    cells = [cell(0, 100, 100), cell(2, 300, 300, "a"), cell(8, 100, 200, "a")]
    rows = {what: (met, figure) for what, met, figure in peer_targets(cells)}
    assert rows[f"{WHAT}, in total (host 2x/8x, disk off)"][0] is False
    assert rows[f"{WHAT}, in every cell"] == (
        False,
        "1 of 2 cells met; worst 1.00x (a, c 16, host 2x)",
    )


def test_without_the_peer_the_target_is_not_checked():
    assert peer_targets(None) == [(WHAT, None, "not checked: the peer was not run")]


def test_offload_lines_set_vllm_beside_itself_without_offloading():
    lines = offload_lines([cell(0, 100, 100), cell(2, 150, 300), cell(8, 200, 300, loaded=0)])
    assert lines[0].startswith("host 2x: vLLM loaded from its CPU tier in 1 of 1 cells")
    assert "150 against 100 without offloading (1.50x); Junction 300 (2.00x vLLM)" in lines[0]
    assert "in 0 of 1 cells" in lines[1]
