"""When `junction up` starts a part again that exited on its own, and when it gives up on it.

A part that exits after it started (an engine killed, the API crashed) is started again with
the same command line (an engine: its id, its port, its disk tier directory) after a backoff
that doubles with each exit in the last `window_s` seconds. One that exits `max_exits` times in
that window keeps dying: it is left down, reported with its last `tail_lines` lines of log, and
the rest of the stack keeps running. Only Ctrl-C (SIGINT or SIGTERM to `junction up`) stops
the stack. Everything kept per part is bounded: its exit times (`max_exits` of them) and its
last lines (`tail_lines`, each cut at `MAX_LINE_CHARS`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

MAX_LINE_CHARS = 500  # of one kept log line (the whole line is still printed as it comes)


@dataclass(frozen=True)
class RestartPolicy:
    first_backoff_s: float = 0.5  # after a part's first exit in the window
    max_backoff_s: float = 8.0  # the backoff doubles with each exit in the window, up to this
    max_exits: int = 5  # exits within `window_s` that leave the part down
    window_s: float = 60.0
    tail_lines: int = 20  # the last lines of a part's log kept to report when it is left down

    def __post_init__(self) -> None:
        if self.first_backoff_s < 0 or self.max_backoff_s < self.first_backoff_s:
            raise ValueError(
                f"backoff: need 0 <= first ({self.first_backoff_s}) <= max ({self.max_backoff_s})"
            )
        if self.max_exits < 1 or self.window_s <= 0 or self.tail_lines < 1:
            raise ValueError(
                f"max_exits ({self.max_exits}), window_s ({self.window_s}) and tail_lines "
                f"({self.tail_lines}) must be positive"
            )


class Exits:
    """One part's recent exits: whether to start it again, and after how long."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.times: deque[float] = deque(maxlen=policy.max_exits)
        self.num_restarts = 0

    def exited(self, now: float) -> float | None:
        """Count an exit at `now` (monotonic seconds); the backoff before the part starts
        again, or None when it has exited `max_exits` times within the window: left down."""
        self.times.append(now)
        recent = self.num_recent(now)
        if recent >= self.policy.max_exits:
            return None
        self.num_restarts += 1
        backoff = self.policy.first_backoff_s * 2 ** (recent - 1)
        return min(backoff, self.policy.max_backoff_s)

    def num_recent(self, now: float) -> int:
        """Exits within the window before `now`."""
        return sum(now - at <= self.policy.window_s for at in self.times)


class Tail:
    """A part's last lines of log, bounded."""

    def __init__(self, num_lines: int) -> None:
        self.lines: deque[str] = deque(maxlen=num_lines)

    def add(self, line: str) -> None:
        line = line.rstrip()
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + f" ... ({len(line) - MAX_LINE_CHARS} more characters)"
        self.lines.append(line)
