"""A what-if report as a rich table: the settings ranked by the hit tokens they save."""

from __future__ import annotations

from rich.table import Table

from whatif.report import SettingResult, WhatIfReport


def report_table(report: WhatIfReport) -> Table:
    if report.peer is not None:
        title = (
            f"what-if for a bridged {report.peer} engine: {report.num_requests:,} request "
            f"prefixes rebuilt from its stored blocks, {report.num_prompt_tokens:,} tokens; "
            f"its attention matched {report.recorded_tokens:,} of them (its hits are at most "
            f"that); each setting is Junction's engine unless it says otherwise"
        )
    else:
        agreement = "exact" if report.exact else "not exact"
        title = (
            f"what-if: {report.num_requests:,} requests, {report.num_prompt_tokens:,} prompt "
            f"tokens, {report.recorded_tokens:,} hit as recorded; its own settings replayed "
            f"reproduce {report.agreement:,} of {report.num_requests:,} requests' hits "
            f"({agreement})"
        )
    table = Table(title=title, title_justify="left")
    results = [report.as_ran, *report.results]
    tiered = any(r.host_hit_tokens or r.disk_hit_tokens or _has_tiers(r) for r in results)
    for header in (
        "setting",
        "hit tokens",
        *(("from host", "from disk") if tiered else ()),
        "hit rate",
        "of oracle",
        "of bound",
        "gain",
        "gain/req",
        "changed",
    ):
        table.add_column(header, justify="left" if header == "setting" else "right")
    table.add_row(*_cells(report, report.as_ran, tiered), end_section=True)
    for result in report.ranked():
        table.add_row(*_cells(report, result, tiered))
    unplaced = [
        f"{result.label}: pin {pin['pin']!r} not placed ({pin['reason']})"
        for result in [report.as_ran, *report.ranked()]
        for pin in result.pins_not_placed
    ]
    if unplaced:  # that setting ran without the pin; the others are whole
        table.caption, table.caption_justify = "\n".join(unplaced), "left"
    return table


def _has_tiers(result: SettingResult) -> bool:
    return bool(result.changes.get("host_cache_bytes") or result.changes.get("disk_cache_bytes"))


def _cells(report: WhatIfReport, result: SettingResult, tiered: bool) -> list[str]:
    gain = report.gain(result)
    if result.hits and report.as_ran.hits:
        changed = f"{sum(a != b for a, b in zip(result.hits, report.as_ran.hits, strict=True)):,}"
    else:
        changed = "-"  # a stored report keeps no per-request hits
    per_request = gain / report.num_requests if report.num_requests else 0.0
    return [
        result.label,
        f"{result.hit_tokens:,}",
        *((f"{result.host_hit_tokens:,}", f"{result.disk_hit_tokens:,}") if tiered else ()),
        f"{result.hit_rate:.1%}",
        f"{result.share_of_oracle:.1%}",
        f"{result.share_of_bound:.1%}",
        f"{gain:+,}",
        f"{per_request:+,.1f}",
        changed,
    ]
