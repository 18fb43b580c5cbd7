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


def dry_run_in(venv: Path, target: str) -> list[str]:
    """`make -n TARGET` with `VENV=venv`: what it would run against that virtualenv's stamps
    (no -B: make decides, from the stamps' times against pyproject.toml's, what is stale)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def made_venv(tmp_path: Path, *stamps: str, newer: bool) -> Path:
    """A virtualenv as make sees it (a python, the stamps), the stamps newer or older than
    pyproject.toml (which is left as it is)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    changed = (ROOT / "pyproject.toml").stat().st_mtime
    when = changed + 60 if newer else changed - 60
    for stamp in stamps:
        (venv / stamp).touch()
        os.utime(venv / stamp, (when, when))
    return venv


def installs(lines: list[str]) -> list[str]:
    """The lines that install Junction (a fresh virtualenv's pip upgrade aside)."""
    return [line for line in lines if "pip install" in line and " -e " in line]


def test_make_run_installs_nothing_when_pyproject_is_unchanged(tmp_path: Path) -> None:
    venv = made_venv(tmp_path, ".installed", newer=True)
    lines = dry_run_in(venv, "run")
    assert installs(lines) == [], lines
    assert lines[-1].startswith(f"{venv}/bin/junction up"), lines


def test_make_run_installs_junction_without_test_extras_when_pyproject_changed(
    tmp_path: Path,
) -> None:
    for venv in (made_venv(tmp_path / "old", ".installed", newer=False), tmp_path / "fresh"):
        lines = dry_run_in(venv, "run")
        (install,) = installs(lines)
        assert install.endswith("pip install --quiet -e ."), lines  # no '.[test]'
        assert lines[-1].startswith(f"{venv}/bin/junction up"), lines


def test_make_test_installs_the_test_extras_when_they_are_stale_or_missing(tmp_path: Path) -> None:
    # `make run` installed Junction alone: the test extras are still missing
    venv = made_venv(tmp_path / "ran", ".installed", newer=True)
    assert installs(dry_run_in(venv, "test")) == [
        f"{venv}/bin/python -m pip install --quiet -e '.[test]'"
    ]
    venv = made_venv(tmp_path / "stale", ".installed", ".installed-test", newer=False)
    assert len(installs(dry_run_in(venv, "test"))) == 1
    # installed since pyproject.toml last changed: neither `make test` nor `make run` installs
    venv = made_venv(tmp_path / "fresh", ".installed", ".installed-test", newer=True)
    assert installs(dry_run_in(venv, "test")) == []
    assert installs(dry_run_in(venv, "run")) == []
