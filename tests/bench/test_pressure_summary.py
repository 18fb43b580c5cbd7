"""`benchmarks/pressure.py`'s summary of the default policy's targets, on hand-made cells: the
worst cell, each level's total, and vLLM's totals."""

from __future__ import annotations

from benchmarks.pressure import level_shares, targets
from benchmarks.pressure_cells import Cell
from workloads.bound import Budget


def cell(level: float, bound: int, ours: int, vllm: int, family: str = "f") -> Cell:
    return Cell(
        family, 1, level, Budget(10, 2), False, 1000, bound, bound, bound, {"p": ours}, vllm, vllm
    )


def test_each_level_sums_its_cells_before_dividing():
    cells = [cell(0.25, 1000, 800, 500), cell(0.25, 3000, 2900, 500), cell(1.0, 100, 100, 100)]
    assert level_shares(cells, "p") == {0.25: 3700 / 4000, 1.0: 1.0}
    rows = {what: (met, figure) for what, met, figure in targets(cells, "p")}
    assert rows[">= 90% of the bound in every cell"] == (False, "worst 80.0% (f, c 1, 25%)")
    assert rows[">= 90% of the bound in each level's total"] == (True, "25% 92.5%, 100% 100.0%")
    assert rows["never below vLLM's total in a cell"] == (True, "0 cells below")


def test_a_level_below_90_percent_and_a_cell_below_vllm_are_missed():
    cells = [cell(0.5, 1000, 850, 900, "g"), cell(1.0, 100, 100, 90)]
    rows = {what: (met, figure) for what, met, figure in targets(cells, "p")}
    assert rows[">= 90% of the bound in each level's total"] == (False, "50% 85.0%, 100% 100.0%")
    assert rows["never below vLLM's total in a cell"] == (False, "1 cells below; g c 1 50%")
    assert rows[">= 1.3x vLLM's total under pressure"] == (False, "0.94x")
