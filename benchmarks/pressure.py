"""Under memory pressure: every eviction policy and vLLM against the bound, in one run.

Four workload families (shared system prompts, multi-turn agents, prefix repetition, chat with
tools), three memory levels each (25%, 50% and 100% of the working set, floored at what the
requests in flight need: `pressure_cells.py` says how), concurrency 1 and 16. Each cell runs
Junction's engine once per policy of `EVICTION_NAMES` (defaults otherwise, the null runner)
and vLLM 0.33's scheduler (the peer, `make peer`) twice: by blocks (its one pool gets both
budgets' blocks) and by bytes (pages of `Bm` tokens holding the same bytes, as vLLM runs real
hybrids; `pressure_cells.py` says how). It prints hit tokens as % of the bound under memory
(`workloads.bound`: Belady's offline eviction, a reference, not a proven optimum; a cell
above 100% is printed as it is) beside the memory-free oracle, and each policy's hit tokens
over vLLM's. Beside the bound, the order-blind reference (`bound(..., order_blind=True)`: the
same model knowing how often each item is read again but not when) says how much of the bound
comes from knowing the order, and the default policy's share of it. The summary checks the
default policy's targets: >= 90% of the bound in every cell and in each level's total, and
against each vLLM run >= 1.3x its total under pressure (the 25% and 50% levels) and never below
its total in a cell.

    make peer && .venv/bin/python benchmarks/pressure.py [--json OUT] [--no-peer]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peer.client import PeerProcess, peer_python  # noqa: E402
from benchmarks.pressure_cells import (  # noqa: E402
    CONCURRENCIES,
    FAMILIES,
    LEVELS,
    Cell,
    family_requests,
    level_budgets,
    run_cell,
)
from engine.cache.eviction import DEFAULT_EVICTION, EVICTION_NAMES  # noqa: E402

PRESSURE_LEVELS = (0.25, 0.5)


def share(tokens: int | None, of: int) -> str:
    return "-" if tokens is None else f"{tokens / of:.1%}" if of else "-"


def over(tokens: int, theirs: int | None) -> str:
    return "-" if not theirs else f"{tokens / theirs:.2f}x"


def cells_table(cells: list[Cell], policies: list[str]) -> Table:
    table = Table(title="hit tokens as % of the bound under memory", title_justify="left")
    for header in ("family", "c", "level", "pools attn/mamba", "oracle tok", "bound tok"):
        table.add_column(header, justify="left" if header == "family" else "right")
    table.add_column("order-blind % bound", justify="right")
    for name in [*policies, "vLLM", "vLLM by bytes"]:
        table.add_column(f"{name} % bound", justify="right")
    table.add_column(f"{policies[0]} % order-blind", justify="right")
    for name in policies:
        table.add_column(f"{name} / vLLM", justify="right")
    table.add_column(f"{policies[0]} / vLLM by bytes", justify="right")
    for cell in cells:
        vllm = cell.vllm_tokens
        table.add_row(
            cell.family,
            str(cell.concurrency),
            f"{cell.level:.0%}" + (" (floor)" if cell.is_floored else ""),
            f"{cell.budget.num_blocks:,} / {cell.budget.num_mamba_blocks:,}",
            f"{cell.oracle_tokens:,}",
            f"{cell.bound_tokens:,}",
            share(cell.blind_tokens, cell.bound_tokens),
            *(share(cell.policy_tokens[name], cell.bound_tokens) for name in policies),
            share(vllm, cell.bound_tokens),
            share(cell.vllm_bytes_tokens, cell.bound_tokens),
            share(cell.policy_tokens[policies[0]], cell.blind_tokens),
            *(over(cell.policy_tokens[name], vllm) for name in policies),
            over(cell.policy_tokens[policies[0]], cell.vllm_bytes_tokens),
        )
    return table


def fraction(tokens: int, of: int) -> float:
    """`tokens / of`, 1 for a cell whose reference keeps nothing."""
    return tokens / of if of else 1.0


def where(cell: Cell) -> str:
    return f"{cell.family}, c {cell.concurrency}, {cell.level:.0%}"


def targets(cells: list[Cell], name: str) -> list[tuple[str, bool, str]]:
    """The default policy's three targets: (what, met, the figure)."""
    worst = min(cells, key=lambda c: fraction(c.policy_tokens[name], c.bound_tokens))
    worst_share = fraction(worst.policy_tokens[name], worst.bound_tokens)
    levels = level_shares(cells, name)
    rows = [
        (
            ">= 90% of the bound in every cell",
            worst_share >= 0.9,
            f"worst {worst_share:.1%} ({where(worst)})",
        ),
        (
            ">= 90% of the bound in each level's total",
            all(share >= 0.9 for share in levels.values()),
            ", ".join(f"{level:.0%} {share:.1%}" for level, share in levels.items()),
        ),
    ]
    for view, field in (("vLLM", "vllm_tokens"), ("vLLM by bytes", "vllm_bytes_tokens")):
        if any(getattr(c, field) is None for c in cells):
            continue
        pressed = [c for c in cells if c.level in PRESSURE_LEVELS]
        ours = sum(c.policy_tokens[name] for c in pressed)
        theirs = sum(getattr(c, field) for c in pressed)
        ratio = ours / theirs if theirs else float("inf")
        rows.append((f">= 1.3x {view}'s total under pressure", ratio >= 1.3, f"{ratio:.2f}x"))
        below = [c for c in cells if c.policy_tokens[name] < getattr(c, field)]
        rows.append(
            (
                f"never below {view}'s total in a cell",
                not below,
                f"{len(below)} cells below"
                + "".join(f"; {c.family} c {c.concurrency} {c.level:.0%}" for c in below),
            )
        )
    return rows


def level_shares(cells: list[Cell], name: str) -> dict[float, float]:
    """Per memory level, the policy's hit tokens over the bound's, summed over its cells."""
    totals: dict[float, list[int]] = {}
    for cell in cells:
        kept = totals.setdefault(cell.level, [0, 0])
        kept[0] += cell.policy_tokens[name]
        kept[1] += cell.bound_tokens
    return {level: fraction(ours, bound) for level, (ours, bound) in totals.items()}


def against_order_blind(cells: list[Cell], name: str) -> list[str]:
    """What the order-blind reference says (no target): how much of the bound a policy that
    knows how often but not when keeps, and the default policy's share of it."""
    blind = min(cells, key=lambda c: fraction(c.blind_tokens, c.bound_tokens))
    ours = min(cells, key=lambda c: fraction(c.policy_tokens[name], c.blind_tokens))
    num_at_90 = sum(fraction(c.policy_tokens[name], c.blind_tokens) >= 0.9 for c in cells)
    return [
        f"the order-blind reference keeps {fraction(blind.blind_tokens, blind.bound_tokens):.1%}"
        f" of the bound at worst ({where(blind)})",
        f"{name} keeps {fraction(ours.policy_tokens[name], ours.blind_tokens):.1%} of the"
        f" order-blind reference at worst ({where(ours)}); {num_at_90} of {len(cells)} cells"
        " at or above 90% of it",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="OUT", help="write every cell's numbers here")
    parser.add_argument("--no-peer", action="store_true", help="skip vLLM (no `make peer`)")
    args = parser.parse_args()
    console = Console(width=220)
    policies = list(EVICTION_NAMES)
    peer = None
    if not args.no_peer:
        if peer_python() is None:
            console.print("no peer environment: run `make peer`, or pass --no-peer")
            return 2
        peer = PeerProcess()
        peer.start()
    cells: list[Cell] = []
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(
                "cells", total=len(FAMILIES) * len(CONCURRENCIES) * len(LEVELS)
            )
            for family in FAMILIES:
                requests = family_requests(family)
                for concurrency in CONCURRENCIES:
                    for level in level_budgets(requests, concurrency):
                        progress.update(
                            task, description=f"{family}, c {concurrency}, {level[0]:.0%}"
                        )
                        cells.append(run_cell(family, requests, concurrency, level, policies, peer))
                        progress.advance(task)
    finally:
        if peer is not None:
            console.print(f"vLLM {peer.version}")
            peer.close()
    console.print(cells_table(cells, policies))
    above = [c for c in cells if any(t > c.bound_tokens for t in c.policy_tokens.values())]
    if above:
        console.print(f"{len(above)} cells where a policy passed the bound (it is no optimum)")
    console.print(f"targets of the default policy, {DEFAULT_EVICTION}:")
    for what, met, figure in targets(cells, DEFAULT_EVICTION):
        console.print(
            f"  [{'green' if met else 'red'}]{'met' if met else 'missed'}[/] {what}: {figure}"
        )
    console.print("against the order-blind reference (how often, not when; no target):")
    for line in against_order_blind(cells, DEFAULT_EVICTION):
        console.print(f"  {line}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"default": DEFAULT_EVICTION, "cells": [c._asdict() for c in cells]}, indent=2
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
