"""Waiting in tests for what another thread or process does: a condition polled until it holds
or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    predicate: Callable[[], object], timeout_s: float = 5.0, interval_s: float = 0.01
) -> bool:
    """Whether `predicate()` comes true within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 60) -> None:
    """`check()` must come true within `timeout_s` (polled every 0.2 s: other processes);
    fails the test naming `what` otherwise."""
    if not wait_until(check, timeout_s, interval_s=0.2):
        raise AssertionError(f"timed out waiting for {what}")
