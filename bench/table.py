"""The results of a run as a rich table, one row per mode: its hit rate beside the oracle's
and the bound under memory's, and its hits as a share of the bound ("-" for results stored
before the bound was measured)."""

from __future__ import annotations

from rich.table import Table


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _share(hit_rate: float, bound_rate: float | None) -> str:
    if bound_rate is None:
        return "-"
    return f"{hit_rate / bound_rate:.1%}" if bound_rate else "-"


def results_table(results: dict) -> Table:
    workload = results["workload"]
    title = (
        f"{results['name']}: {workload['kind']}, {workload['num_requests']} requests, "
        f"{workload['num_prompt_tokens']:,} prompt tokens; runner {results['runner']}, "
        f"concurrency {results['concurrency']}, U {results['match_unit']}"
    )
    table = Table(title=title, title_justify="left")
    for header in (
        "mode",
        "hit rate",
        "oracle",
        "bound",
        "% of bound",
        "cached tok",
        "computed tok",
        "fwd passes",
        "CoW",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "tok/s",
        "peak blocks attn/mamba",
        "wall s",
    ):
        table.add_column(header, justify="left" if header == "mode" else "right")
    for row in results["modes"]:
        peak = row.get("peak_blocks_used")
        bound_rate = row.get("bound_hit_rate")
        table.add_row(
            row["mode"],
            f"{row['hit_rate']:.1%}",
            f"{row['oracle_hit_rate']:.1%}",
            "-" if bound_rate is None else f"{bound_rate:.1%}",
            _share(row["hit_rate"], bound_rate),
            _int(row["num_cached_tokens"]),
            _int(row["computed_tokens"]),
            _int(row["forward_passes"]),
            _int(row["cow_copies"]),
            _ms(row["ttft_median_s"]),
            _ms(row["ttft_p99_s"]),
            f"{row['throughput_tok_s']:,.0f}",
            "-" if peak is None else f"{peak['attention']:,} / {peak['mamba']:,}",
            f"{row['wall_s']:.2f}",
        )
    return table
