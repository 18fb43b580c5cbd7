"""`junction up`'s supervisor outlives a part, on real processes: one that is killed is started
again with the same command line after its backoff, said in one line with its exit code; one
that keeps dying is left down after `max_exits` exits in the window, reported with its last
lines (only the last `tail_lines`), while the rest keep running; only `stop` ends them."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import sys
import threading
from typing import TextIO

import pytest

from stack.parts import Part
from stack.restarts import MAX_LINE_CHARS, Exits, RestartPolicy, Tail
from stack.supervisor import Supervisor
from tests.polling import wait_for
from tests.stack.test_up import is_alive

FAST = RestartPolicy(
    first_backoff_s=0.05, max_backoff_s=0.2, max_exits=3, window_s=60, tail_lines=4
)
STEADY = Part(
    "steady", [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"]
)
# 10 numbered lines, then exit code 3: each run, at once
FLAKY = Part(
    "flaky",
    [sys.executable, "-c", "import sys; [print('line', i) for i in range(10)]; sys.exit(3)"],
)


class Watched:
    """A supervisor over `parts`, started and tended in a thread until `stop`."""

    def __init__(self, parts: list[Part], out: TextIO | None = None) -> None:
        self.out = out or io.StringIO()
        self.supervisor = Supervisor(parts, out=self.out, color=False, policy=FAST)
        self.supervisor.start()
        self.thread = threading.Thread(target=self.supervisor.watch, daemon=True)
        self.thread.start()

    def lines(self, name: str) -> list[str]:
        prefix = f"{name:>{self.supervisor.width}} | "
        return [
            line[len(prefix) :]
            for line in self.out.getvalue().splitlines()
            if line.startswith(prefix)
        ]

    def pids(self, name: str) -> list[int]:
        found = (re.match(r"started \(pid (\d+)\)", line) for line in self.lines(name))
        return [int(m.group(1)) for m in found if m]

    def stop(self) -> None:
        self.supervisor.stopping.set()
        self.thread.join(5)
        self.supervisor.stop(timeout_s=5)


def test_a_killed_part_is_started_again_with_its_exit_code_and_backoff_said():
    watched = Watched([STEADY, Part("other", STEADY.argv)])
    try:
        (first,) = watched.pids("steady")
        os.kill(first, signal.SIGKILL)
        wait_for("steady started again", lambda: len(watched.pids("steady")) == 2, 10)
        said = [line for line in watched.lines("steady") if line.startswith("exited")]
        assert said == ["exited with code -9: restart 1 in 0.05 s (exits: 1 of 3 in 60 s)"]
        second = watched.pids("steady")[1]
        assert second != first and is_alive(second)
        again = f"started (pid {second}): {' '.join(STEADY.argv[1:])}"  # the same argv
        assert again in watched.lines("steady")
        assert len(watched.pids("other")) == 1  # the rest untouched
        assert watched.supervisor.left_down() == []
    finally:
        watched.stop()
    assert not is_alive(second)
    assert watched.lines("steady")[-1] == "stopped"


def test_a_part_that_keeps_dying_is_left_down_with_its_last_lines_and_the_rest_lives_on():
    watched = Watched([STEADY, FLAKY])
    try:
        wait_for("flaky left down", lambda: watched.supervisor.left_down() == ["flaky"], 10)
        (steady,) = watched.pids("steady")
        assert is_alive(steady)
        assert len(watched.pids("flaky")) == 3  # started, then again twice: not looped
        flaky = watched.lines("flaky")
        restarts = [line for line in flaky if line.startswith("exited with code 3: restart")]
        assert restarts == [
            "exited with code 3: restart 1 in 0.05 s (exits: 1 of 3 in 60 s)",
            "exited with code 3: restart 2 in 0.1 s (exits: 2 of 3 in 60 s)",
        ]
        report = flaky.index(
            "exited with code 3 and keeps dying (exits: 3 of 3 in 60 s): left down, "
            "not started again; its last 4 lines:"
        )
        assert flaky[report + 1 :] == [f"    line {i}" for i in range(6, 10)]  # bounded
        watched.supervisor.tend()  # tended again: still not started
        assert len(watched.pids("flaky")) == 3
    finally:
        watched.stop()
    assert not is_alive(steady)
    assert watched.lines("flaky")[-1] == "left down (exit code 3)"


def test_a_closed_output_stops_neither_the_tending_nor_the_stop():
    """`junction up | head`, a closed terminal: printing fails, and the parts are still started
    again and stopped (not left running on their own)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    gone = open(write_end, "w")  # closed below, where its flush fails
    try:
        watched = Watched([STEADY], out=gone)
        first = watched.supervisor.running[0].process.pid
        os.kill(first, signal.SIGKILL)
        wait_for(
            "steady started again", lambda: watched.supervisor.running[0].process.pid != first, 10
        )
        second = watched.supervisor.running[0].process.pid
        assert is_alive(second) and watched.supervisor.is_out_gone
        watched.stop()
        assert not is_alive(second)
    finally:
        with contextlib.suppress(BrokenPipeError):
            gone.close()


def test_the_backoff_doubles_within_the_window_and_exits_before_it_are_forgotten():
    exits = Exits(RestartPolicy(first_backoff_s=1, max_backoff_s=3, max_exits=4, window_s=10))
    assert [exits.exited(t) for t in (0, 1, 2)] == [1, 2, 3]  # 4 capped at max_backoff_s
    assert exits.exited(20) == 1  # the three before are out of the window
    assert [exits.exited(t) for t in (21, 22)] == [2, 3]
    assert exits.exited(23) is None  # the 4th in 10 s: left down
    assert exits.num_restarts == 6
    assert len(exits.times) == 4  # bounded by max_exits


def test_a_kept_line_is_bounded():
    tail = Tail(2)
    for line in ("a\n", "b\n", "x" * (MAX_LINE_CHARS + 7) + "\n"):
        tail.add(line)
    assert tail.lines[0] == "b"
    assert tail.lines[1] == "x" * MAX_LINE_CHARS + " ... (7 more characters)"


@pytest.mark.parametrize(
    "settings",
    [{"first_backoff_s": -1}, {"first_backoff_s": 9, "max_backoff_s": 1}, {"max_exits": 0}],
)
def test_a_bad_policy_is_refused(settings: dict):
    with pytest.raises(ValueError):
        RestartPolicy(**settings)
