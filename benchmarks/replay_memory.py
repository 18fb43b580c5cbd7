"""Peak memory of `junction replay` on a 500- and a 5000-request trace, side by side.

The traces are the generated-shared-prefix workload at 3620 prompt tokens a request (1.81M and
18.1M tokens). Each replay runs in its own process, with no event listener and with every event
streamed to a file (`--events-out`); the peak resident set of each process is read from the
kernel when it exits. A replay that held its trace, its records or its events in memory would
grow about tenfold from the first column to the second.

    .venv/bin/python benchmarks/replay_memory.py [--runner null|ledger] [--sizes 500,5000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workloads import build_workload


def write_trace(directory: Path, num_requests: int) -> Path:
    workload = build_workload(
        {
            "kind": "generated_shared_prefix",
            "num_groups": max(num_requests // 20, 1),
            "prompts_per_group": 20,
            "system_prompt_len": 3500,
            "question_len": 120,
            "output_len": 16,
        }
    )
    path = directory / f"trace-{num_requests}.jsonl"
    path.write_text(workload.jsonl(), encoding="utf-8")
    return path


def peak_rss_mb(argv: list[str]) -> tuple[float, float]:
    """(peak resident MB, wall seconds) of one child process; raises if it fails."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    stderr = process.stderr.read().decode() if process.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {stderr.strip()[-500:]}")
    return usage.ru_maxrss / 1024, wall  # Linux reports kilobytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runner", choices=("null", "ledger"), default="null")
    parser.add_argument("--sizes", default="500,5000", help="requests per trace, comma-separated")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="junction-memory-") as tmp:
        directory = Path(tmp)
        traces = {size: write_trace(directory, size) for size in sizes}
        rows = []
        for label, extra in (("no listener", []), ("--events-out", ["--events-out"])):
            cells = []
            for size, trace in traces.items():
                argv = [sys.executable, "-m", "cli.main", "replay", str(trace)]
                argv += ["--runner", args.runner, "--out", os.devnull, "--quiet"]
                if extra:
                    argv += [*extra, str(directory / f"events-{size}.jsonl")]
                cells.append(peak_rss_mb(argv))
                events = directory / f"events-{size}.jsonl"
                if events.exists():
                    events.unlink()  # a 5000-request run writes gigabytes of events
            rows.append((label, cells))
    header = "".join(f"{f'{size} requests':>24}" for size in sizes)
    print(f"peak RSS of `junction replay --runner {args.runner}`")
    print(f"{'':16}{header}")
    for label, cells in rows:
        line = "".join(f"{f'{mb:.0f} MB ({wall:.0f} s)':>24}" for mb, wall in cells)
        print(f"{label:16}{line}")
        print(f"{'':16}{'':>24}{f'ratio {cells[-1][0] / cells[0][0]:.2f}x':>24}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
