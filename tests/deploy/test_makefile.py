"""Every `make TARGET` the README and docs/ name is a Makefile target that does something, and
`make bench-ttft` runs `benchmarks/ttft.py` (`make -n`: printed, not run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def documented_targets() -> set[str]:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {t for path in texts for t in re.findall(r"`make ([a-z][\w-]*)", path.read_text())}


def dry_run(target: str) -> subprocess.CompletedProcess:
    """`make -n -B TARGET`: what it would run, every step, nothing run (as a top-level make:
    under `make test` the inherited MAKEFLAGS would add "Entering directory" lines)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(
        ["make", "-n", "-B", "--no-print-directory", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")


def test_every_documented_target_has_a_recipe() -> None:
    targets = documented_targets()
    assert "bench-ttft" in targets
    for target in targets:
        dry = dry_run(target)
        assert dry.returncode == 0 and dry.stdout.strip(), (target, dry.stderr)


def test_make_bench_ttft_runs_the_benchmark() -> None:
    dry = dry_run("bench-ttft")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip().splitlines()[-1].endswith("python benchmarks/ttft.py")
    assert (ROOT / "benchmarks" / "ttft.py").is_file()
