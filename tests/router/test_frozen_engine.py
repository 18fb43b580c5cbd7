"""A frozen engine (SIGSTOP) is taken out within the feed's silence bound, and a request in
flight there is answered once the engine has sent nothing for `--read-timeout` (issue 47,
item 7). Before, the router's feed client waited out a 10 s close handshake the frozen engine
never answered (down after 11.6 s), and a request sent there waited, unanswered, until the
engine resumed."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.polling import wait_for
from tests.router.processes import MODEL, engine_status, running, start_engine, start_router

READ_TIMEOUT_S = 3


def complete(router_url: str, n: int) -> tuple[int | str, float, str]:
    """One completion: its status (or the exception's name), seconds, and body."""
    started = time.monotonic()
    try:
        answer = httpx.post(
            f"{router_url}/v1/completions",
            json={"model": MODEL, "prompt": f"frozen {n}", "max_tokens": 2},
            timeout=20,
        )
        return answer.status_code, time.monotonic() - started, answer.text
    except httpx.HTTPError as exc:
        return type(exc).__name__, time.monotonic() - started, ""


def test_a_frozen_engine_is_out_at_once_and_its_requests_are_answered(tmp_path: Path) -> None:
    engines = [start_engine(tmp_path, name, "--host-cache-bytes", "0") for name in ("a", "b")]
    with running(*engines) as [frozen, _]:
        router = start_router(tmp_path, engines, "--read-timeout", str(READ_TIMEOUT_S))
        try:
            wait_for("both engines up", lambda: engine_status(router, frozen) == "up", 30)
            os.kill(frozen.process.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            try:

                def down_after_s() -> float:
                    wait_for("the engine down", lambda: engine_status(router, frozen) == "down", 30)
                    return time.monotonic() - stopped

                with ThreadPoolExecutor(9) as pool:  # sent before the router can know
                    down = pool.submit(down_after_s)
                    in_flight = list(pool.map(lambda n: complete(router.url, n), range(8)))
                    down_s = down.result()
                after = [complete(router.url, 100 + n) for n in range(10)]
            finally:
                os.kill(frozen.process.pid, signal.SIGCONT)
        finally:
            router.stop()
    assert down_s < 5, down_s  # 1.5 s of silence; before: 11.6 s
    for status, seconds, body in in_flight:
        assert status == 200 or (status == 502 and "--read-timeout" in body), (status, body)
        assert seconds < READ_TIMEOUT_S + 5, seconds
    assert [status for status, _, _ in after] == [200] * 10, after
