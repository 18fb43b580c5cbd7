"""Host-memory and disk tiers under the device pools (issue 46), in one run.

Five workloads (the four pressure families of `pressure_cells.py` and a multi-tenant agentic
trace: tenants with their own cache salts over three shared system prompts of 700-3300 tokens),
at concurrency 1 and 16, device pools at 25% of each one's working set (floored at what the
requests in flight need, as `pressure_cells.py` floors them), a host tier of 0x, 2x and 8x the
device pools' bytes, and a disk tier (16x, a temp directory) off and on. With the disk on, the
trace is also replayed with an engine restart halfway: a second engine on the same directory
replays the second half, and the hit rate of its first 100 requests is set against the hit rate
before the restart. Bytes are the built-in model's (`engine.setup.footprint`); the null runner
sizes each unit by them (`tiers_cells.py`).

Per cell: hit tokens as % of the memory-free oracle, the bytes each tier took in and gave out,
the loads refused as slower than prefilling, and a modelled prefill time: the tokens not hit at
the prefill rate measured here (the torch runner's built-in model on a 512-token prompt, CPU)
plus the bytes loaded from each tier at its measured bandwidth (`measure_host_bandwidth`,
`measure_disk_bandwidth`). The engines get the same three rates, so a load slower than the
prefill it saves is refused and counted.

Beside the host 2x and 8x cells (disk off), vLLM 0.33 with its own CPU offloading (the peer,
`make peer`; `tiers_peer.py` says how): the same requests and concurrency, the same device
bytes, CPU bytes equal to Junction's host tier, transfers instantaneous; and vLLM without
offloading, so its gain from the CPU tier shows. Targets, printed as met or missed: host 8x
(no disk) >= 95% of the oracle on every workload; >= 1.5x vLLM-with-offload's hit tokens at
equal bytes (in total over the peer's cells, and in every cell; only when the peer ran);
after a restart, >= 90% of the pre-restart hit rate within 100 requests.

    .venv/bin/python benchmarks/tiers.py [--quick] [--json OUT] [--no-peer]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peer.client import PeerError, PeerProcess, peer_python  # noqa: E402
from benchmarks.tiers_cells import (  # noqa: E402
    DISK_MULTIPLE,
    HOST_MULTIPLES,
    LEVEL,
    RESTART_WINDOW,
    Rates,
    Restart,
    Workload,
    measure_rates,
    run_workload,
    workloads,
)
from benchmarks.tiers_peer import PEER_HOST_MULTIPLES, PeerCell, run_peer_cells  # noqa: E402
from engine.config import ModelConfig  # noqa: E402
from engine.setup.footprint import footprint  # noqa: E402

CONCURRENCIES = (1, 16)
HOST_TARGET, PEER_TARGET, RESTART_TARGET = 0.95, 1.5, 0.9

MB = 1e6


def mb(num_bytes: int) -> str:
    return f"{num_bytes / MB:,.1f}"


def pct(tokens: int, of: int) -> str:
    return f"{tokens / of:.1%}" if of else "-"


def rates_table(rates: Rates) -> Table:
    found = footprint(ModelConfig())
    table = Table(title="measured here (CPU) and the model's bytes", title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row(
        "prefill rate, torch runner, 512-token prompt", f"{rates.prefill_tokens_per_s:,.0f} tok/s"
    )
    table.add_row(
        "host bandwidth (measure_host_bandwidth)", f"{rates.host_bytes_per_s / 1e9:.2f} GB/s"
    )
    table.add_row(
        "disk bandwidth (measure_disk_bandwidth)", f"{rates.disk_bytes_per_s / 1e9:.2f} GB/s"
    )
    table.add_row("attention bytes per token", f"{found.attention_bytes_per_token:,}")
    table.add_row("Mamba state bytes per slot", f"{found.mamba_bytes_per_slot:,}")
    return table


def workloads_table(done: list[Workload]) -> Table:
    table = Table(title=f"workloads, pools at {LEVEL:.0%} of the working set", title_justify="left")
    for header in (
        "workload",
        "c",
        "requests",
        "pools attn/mamba",
        "device MB",
        "oracle tok",
        "no tiers, whole working set % oracle",
    ):
        table.add_column(header, justify="left" if header == "workload" else "right")
    for w in done:
        table.add_row(
            w.name,
            str(w.concurrency),
            str(w.num_requests),
            f"{w.budget.num_blocks:,} / {w.budget.num_mamba_blocks:,}"
            + (" (floor)" if w.is_floored else ""),
            mb(w.device_bytes),
            f"{w.oracle_tokens:,}",
            pct(w.whole_tokens, w.oracle_tokens),
        )
    return table


def cells_table(done: list[Workload]) -> Table:
    table = Table(
        title="cells: hit tokens, bytes moved per tier (MB), modelled prefill",
        title_justify="left",
    )
    for header in (
        "workload",
        "c",
        "host",
        "disk",
        "hit % oracle",
        "hit tok",
        "host in",
        "host out",
        "disk in",
        "disk out",
        "loads",
        "refused slow",
        "modelled prefill s",
        "vs no tiers",
    ):
        table.add_column(header, justify="left" if header == "workload" else "right")
    for w in done:
        base = next(c for c in w.cells if c.host_multiple == 0 and not c.is_disk)
        for c in w.cells:
            table.add_row(
                c.workload,
                str(c.concurrency),
                f"{c.host_multiple}x",
                f"{DISK_MULTIPLE}x" if c.is_disk else "off",
                pct(c.hit_tokens, c.oracle_tokens),
                f"{c.hit_tokens:,}",
                mb(c.host_in),
                mb(c.host_out),
                mb(c.disk_in),
                mb(c.disk_out),
                str(c.num_loads),
                str(c.num_refused_slow),
                f"{c.modelled_s:.2f}",
                f"{base.modelled_s / c.modelled_s:.2f}x" if c.modelled_s else "-",
            )
    return table


def restarts_table(done: list[Workload]) -> Table:
    table = Table(
        title=f"restart halfway (disk {DISK_MULTIPLE}x): hit rates (cached / prompt tokens)",
        title_justify="left",
    )
    for header in (
        "workload",
        "c",
        "host",
        "before",
        "hit rate before",
        f"last {RESTART_WINDOW} before",
        f"first {RESTART_WINDOW} after",
        "after / before",
        "same requests, no restart",
        "after / no restart",
        "units on disk",
        "loaded tok after",
        "disk MB out after",
    ):
        table.add_column(header, justify="left" if header == "workload" else "right")
    for w in done:
        for r in w.restarts:
            table.add_row(
                r.workload,
                str(r.concurrency),
                f"{r.host_multiple}x",
                str(r.num_before),
                f"{r.before_rate:.1%}",
                f"{r.last_before_rate:.1%}",
                f"{r.after_rate:.1%}",
                f"{restart_share(r):.2f}",
                f"{r.unbroken_rate:.1%}",
                f"{r.after_rate / r.unbroken_rate:.2f}" if r.unbroken_rate else "-",
                f"{r.disk_units_at_restart:,}",
                f"{r.after_loaded_tokens:,}",
                mb(r.after_disk_out),
            )
    return table


def peer_table(cells: list[PeerCell], done: list[Workload], version: str) -> Table:
    table = Table(
        title=f"vLLM {version} with its CPU offloading (OffloadingConnector, LRU, transfers "
        "instant) at Junction's bytes; host 0x: vLLM without offloading",
        title_justify="left",
    )
    for header in (
        "workload",
        "c",
        "host",
        "device MB Junction / vLLM",
        "CPU MB",
        "vLLM CPU chunks",
        "vLLM % oracle",
        "vLLM over no offload",
        "Junction % oracle",
        "Junction / vLLM",
        "vLLM loads",
        "chunks loaded",
        "chunks stored",
    ):
        table.add_column(header, justify="left" if header == "workload" else "right")
    devices = {(w.name, w.concurrency): w.device_bytes for w in done}
    for c in cells:
        base = next(
            b
            for b in cells
            if (b.workload, b.concurrency, b.host_multiple) == (c.workload, c.concurrency, 0)
        )
        table.add_row(
            c.workload,
            str(c.concurrency),
            f"{c.host_multiple}x",
            f"{mb(devices[c.workload, c.concurrency])} / {mb(c.num_pages * c.page_bytes)}",
            mb(c.cpu_bytes),
            f"{c.num_cpu_chunks:,}",
            pct(c.hit_tokens, c.oracle_tokens),
            f"{c.hit_tokens / base.hit_tokens:.2f}x" if base.hit_tokens else "-",
            pct(c.junction_tokens, c.oracle_tokens),
            f"{c.junction_tokens / c.hit_tokens:.2f}x" if c.hit_tokens else "-",
            f"{c.num_load_jobs:,}",
            f"{c.num_chunks_loaded:,}",
            f"{c.num_chunks_stored:,}",
        )
    return table


def offload_lines(cells: list[PeerCell]) -> list[str]:
    """Whether vLLM's CPU tier worked: loads it served, and its hits over no offloading."""
    lines = []
    for host_multiple in PEER_HOST_MULTIPLES:
        on = [c for c in cells if c.host_multiple == host_multiple]
        off = {(c.workload, c.concurrency): c for c in cells if c.host_multiple == 0}
        num_loading = sum(c.num_chunks_loaded > 0 for c in on)
        ours, theirs = sum(c.junction_tokens for c in on), sum(c.hit_tokens for c in on)
        without = sum(off[c.workload, c.concurrency].hit_tokens for c in on)
        lines.append(
            f"host {host_multiple}x: vLLM loaded from its CPU tier in {num_loading} of "
            f"{len(on)} cells ({sum(c.num_chunks_loaded for c in on):,} chunks loaded, "
            f"{sum(c.num_chunks_stored for c in on):,} stored); its hit tokens "
            f"{theirs:,} against {without:,} without offloading"
            + (f" ({theirs / without:.2f}x)" if without else "")
            + (f"; Junction {ours:,} ({ours / theirs:.2f}x vLLM)" if theirs else "")
        )
    return lines


def restart_share(restart: Restart) -> float:
    """The hit rate of the first requests after the restart over the rate before it."""
    return restart.after_rate / restart.before_rate if restart.before_rate else 1.0


def where(workload: str, concurrency: int) -> str:
    return f"{workload}, c {concurrency}"


def peer_targets(peer: list[PeerCell] | None) -> list[tuple[str, bool | None, str]]:
    """The vLLM-with-offload target, in total over the peer's offload cells and in every
    one; not checked (None) when the peer did not run."""
    what = f">= {PEER_TARGET}x vLLM-with-offload hit tokens at equal bytes"
    if not peer:
        return [(what, None, "not checked: the peer was not run")]
    on = [c for c in peer if c.host_multiple in PEER_HOST_MULTIPLES]
    ours, theirs = sum(c.junction_tokens for c in on), sum(c.hit_tokens for c in on)
    total = ours / theirs if theirs else float("inf")

    def ratio(c: PeerCell) -> float:
        return c.junction_tokens / c.hit_tokens if c.hit_tokens else float("inf")

    worst = min(on, key=ratio)
    num_met = sum(ratio(c) >= PEER_TARGET for c in on)
    hosts = "/".join(f"{h}x" for h in PEER_HOST_MULTIPLES)
    return [
        (
            f"{what}, in total (host {hosts}, disk off)",
            total >= PEER_TARGET,
            f"{total:.2f}x ({ours:,} against {theirs:,} tokens)",
        ),
        (
            f"{what}, in every cell",
            num_met == len(on),
            f"{num_met} of {len(on)} cells met; worst {ratio(worst):.2f}x "
            f"({where(worst.workload, worst.concurrency)}, host {worst.host_multiple}x)",
        ),
    ]


def targets(
    done: list[Workload], peer: list[PeerCell] | None
) -> list[tuple[str, bool | None, str]]:
    """(what, met (None: not checked), the figure)."""
    host = [
        (c.hit_tokens / c.oracle_tokens if c.oracle_tokens else 1.0, c)
        for w in done
        for c in w.cells
        if c.host_multiple == max(HOST_MULTIPLES) and not c.is_disk
    ]
    worst_share, worst = min(host, key=lambda pair: pair[0])
    num_below = sum(share < HOST_TARGET for share, _ in host)
    rows: list[tuple[str, bool | None, str]] = [
        (
            f"host {max(HOST_MULTIPLES)}x (no disk) >= {HOST_TARGET:.0%} of the oracle on "
            "every workload",
            num_below == 0,
            f"worst {worst_share:.1%} ({where(worst.workload, worst.concurrency)}); "
            f"{num_below} of {len(host)} below",
        ),
        *peer_targets(peer),
    ]
    restarts = [r for w in done for r in w.restarts]
    by_host = {}
    for r in restarts:
        by_host.setdefault(r.host_multiple, []).append(r)
    num_met = sum(restart_share(r) >= RESTART_TARGET for r in restarts)
    worst_restart = min(restarts, key=restart_share)
    at = where(worst_restart.workload, worst_restart.concurrency)
    rows.append(
        (
            f"after the restart >= {RESTART_TARGET:.0%} of the pre-restart hit rate within "
            f"{RESTART_WINDOW} requests",
            num_met == len(restarts),
            f"{num_met} of {len(restarts)} restart cells met; worst "
            f"{restart_share(worst_restart):.2f} ({at}, host {worst_restart.host_multiple}x); "
            "per host size met: "
            + ", ".join(
                f"{h}x {sum(restart_share(r) >= RESTART_TARGET for r in rs)}/{len(rs)}"
                for h, rs in sorted(by_host.items())
            ),
        )
    )
    return rows


def run_peer(
    done: list[Workload], found: dict[str, list], console: Console
) -> tuple[list[PeerCell], str]:
    """The peer's cells for every workload and concurrency (`tiers_peer.py`), and vLLM's
    version."""
    cells: list[PeerCell] = []
    with PeerProcess() as peer, Progress(console=console, transient=True) as progress:
        task = progress.add_task("vLLM", total=len(done))
        for w in done:
            progress.update(task, description=f"vLLM: {where(w.name, w.concurrency)}")
            cells += run_peer_cells(peer, w, found[w.name])
            progress.advance(task)
        return cells, peer.version


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="OUT", help="write every cell's numbers here")
    parser.add_argument("--no-peer", action="store_true", help="do not look for vLLM")
    parser.add_argument("--quick", action="store_true", help="c 16, a quarter of each trace")
    args = parser.parse_args()
    console = Console(width=220)
    found = workloads(quick=args.quick)
    concurrencies = (16,) if args.quick else CONCURRENCIES
    with tempfile.TemporaryDirectory(prefix="junction-tiers-probe-") as probe:
        rates = measure_rates(probe)
    console.print(rates_table(rates))
    done: list[Workload] = []
    runs_per = 1 + len(HOST_MULTIPLES) * 3
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("runs", total=len(found) * len(concurrencies) * runs_per)

        def advance(description: str) -> None:
            progress.update(task, description=description)
            progress.advance(task)

        for concurrency in concurrencies:
            for name, requests in found.items():
                done.append(run_workload(name, requests, concurrency, rates, advance))
    console.print(workloads_table(done))
    console.print(cells_table(done))
    console.print(restarts_table(done))
    peer, version = None, None
    if args.no_peer:
        console.print("vLLM peer: not run (--no-peer)")
    elif peer_python() is None:
        console.print("vLLM peer: not run (no .venv-peer: `make peer` builds it)")
    else:
        try:
            peer, version = run_peer(done, found, console)
        except PeerError as exc:
            console.print(f"vLLM peer: failed: {exc}")
    if peer:
        console.print(peer_table(peer, done, version))
        console.print("vLLM's offloading:")
        for line in offload_lines(peer):
            console.print(f"  {line}")
    console.print("targets:")
    for what, met, figure in targets(done, peer):
        label = (
            "[yellow]not checked[/]"
            if met is None
            else "[green]met[/]"
            if met
            else "[red]missed[/]"
        )
        console.print(f"  {label} {what}: {figure}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rates": rates._asdict(),
                    "peer": None
                    if peer is None
                    else {"vllm": version, "cells": [c._asdict() for c in peer]},
                    "workloads": [
                        {
                            **{
                                k: v
                                for k, v in w._asdict().items()
                                if k not in ("cells", "restarts")
                            },
                            "cells": [c._asdict() for c in w.cells],
                            "restarts": [r._asdict() for r in w.restarts],
                        }
                        for w in done
                    ],
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
