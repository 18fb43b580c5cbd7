"""A database cut under load, and what the outbox drops once the store is back.

`junction api` runs in its own process over a scratch PostgreSQL database, reached through a
TCP proxy this script cuts (`benchmarks.tcp_proxy`). Each round, a null-runner engine (16
shared prefixes, 8 in flight, `benchmarks.ingest.Workload`) steps at each of `--steps-per-s`
(a step finishes about one request) with a publisher of a small outbox (`--outbox-bytes`);
the database is cut for `--cut-s`, then restored, and the engine runs on for `--after-s` more.
Past the outbox's bound during the cut, finished requests are dropped by design (counted);
after the store is back (its first ack after the welcome), none should be while the store can
take the engine's pace at all: past that pace, drops go on whatever the rule (the bound).

Two sending rules, in alternating rounds of one run (issue 47, item 3):

- `held` (the default): nothing is sent behind a snapshot until the store acknowledges it,
  so a store catching up applies one transaction per snapshot;
- `pipelined` (before): the batches after a snapshot are sent at once
  (`Outbox.hold_behind_snapshot = False`).

    .venv/bin/python benchmarks/outage.py [--rounds 3] [--outbox-bytes 98304] [--cut-s 5]
        [--after-s 8] [--steps-per-s 25 50 100]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import psycopg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: `benchmarks.ingest` is beside it
    sys.path.insert(0, str(REPO))

from benchmarks.ingest import ADMIN_URL, TOKEN, Workload, start_server, stop  # noqa: E402
from benchmarks.tcp_proxy import TcpProxy  # noqa: E402
from publish.publisher import EventPublisher  # noqa: E402
from publish.publisher_link import Backoff  # noqa: E402

RULES = ("held", "pipelined")
FAST = Backoff(initial_s=0.05, max_s=0.5, unauthorized_s=1.0)


class Round(NamedTuple):
    rule: str
    num_finished: int  # requests the engine finished in the round
    dropped_in_cut: int  # dropped before the store was back: the bound, by design
    dropped_after: int  # dropped after it was back
    back_s: float  # from the restore to the store's first ack after its welcome
    max_waiting: int  # the most finished requests waiting for an ack after it was back


def run_until(work: Workload, done, timeout_s: float, steps_per_s: float = 0.0) -> bool:
    """Step the engine (at most `steps_per_s` steps a second; 0: flat out) until `done()` or
    `timeout_s`; whether `done()` came."""
    start = time.monotonic()
    deadline, num_steps = start + timeout_s, 0
    while time.monotonic() < deadline:
        if done():
            return True
        work.step()
        num_steps += 1
        if steps_per_s > 0:
            time.sleep(max(0.0, start + num_steps / steps_per_s - time.monotonic()))
    return False


def one_round(
    base: str, proxy: TcpProxy, rule: str, pace: float, args: argparse.Namespace
) -> Round:
    work = Workload(f"outage-{rule}-{uuid.uuid4().hex[:8]}")
    finished = 0

    def count(engine) -> None:
        nonlocal finished
        finished += sum(1 for e in engine.sink.events if type(e).__name__ == "RequestFinished")

    work.engine.step_listeners.append(count)
    with EventPublisher(base, TOKEN, backoff=FAST, max_bytes=args.outbox_bytes) as publisher:
        publisher.outbox.hold_behind_snapshot = rule == "held"
        publisher.attach(work.engine)
        stats = publisher.stats
        if not run_until(work, lambda: stats().is_connected, 30, pace):
            raise RuntimeError(f"the publisher never connected: {stats().last_error}")
        run_until(work, lambda: False, 1.0, pace)
        proxy.cut()
        run_until(work, lambda: False, args.cut_s, pace)
        proxy.restore()
        restored = time.monotonic()
        if not run_until(work, lambda: stats().is_connected, 60, pace):
            raise RuntimeError(f"the publisher never reconnected: {stats().last_error}")
        welcomed = stats().num_acked
        if not run_until(work, lambda: stats().num_acked > welcomed, 60, pace):
            raise RuntimeError("the store acknowledged nothing in 60 s after its welcome")
        back, back_s = stats(), time.monotonic() - restored
        max_waiting = 0

        def watch() -> bool:
            nonlocal max_waiting
            max_waiting = max(max_waiting, stats().num_requests_waiting)
            return False

        run_until(work, watch, args.after_s, pace)
        after = stats()
        if not publisher.flush(120):
            raise RuntimeError(f"the store did not catch up in 120 s: {stats()}")
    return Round(
        rule,
        finished,
        back.num_requests_dropped,
        after.num_requests_dropped - back.num_requests_dropped,
        back_s,
        max_waiting,
    )


def report(rounds: list[Round]) -> None:
    print(
        f"{'rule':10} {'finished':>9} {'dropped in cut':>15} {'dropped after':>14} "
        f"{'back s':>7} {'most waiting after':>19}"
    )
    for r in rounds:
        print(
            f"{r.rule:10} {r.num_finished:9,} {r.dropped_in_cut:15,} {r.dropped_after:14,} "
            f"{r.back_s:7.2f} {r.max_waiting:19,}"
        )
    print()
    for rule in RULES:
        mine = [r for r in rounds if r.rule == rule]
        after = [r.dropped_after for r in mine]
        print(
            f"{rule:10}: dropped after the store was back: {sum(after):,} in {len(mine)} rounds "
            f"(median {statistics.median(after):g}, rounds with none: "
            f"{sum(1 for n in after if n == 0)} of {len(mine)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="of each rule, alternating")
    parser.add_argument("--outbox-bytes", type=int, default=96 * 1024)
    parser.add_argument("--cut-s", type=float, default=5.0, help="how long the database is cut")
    parser.add_argument("--after-s", type=float, default=8.0, help="load after the store is back")
    parser.add_argument(
        "--steps-per-s",
        type=float,
        nargs="+",
        default=[25.0, 50.0, 100.0],
        help="the engine's paces, each a run of its own (0: flat out; a step finishes about "
        "one request)",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up below on a kill too
    scratch = f"junction_outage_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{scratch}"')
    proxy = TcpProxy("127.0.0.1", 5432)
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{scratch}"
    server = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            server, base = start_server(url, Path(tmp) / "api.log")
            print(
                f"junction api at {base}, database {scratch} through a proxy; outbox "
                f"{args.outbox_bytes:,} bytes, cut {args.cut_s:g} s, {args.after_s:g} s after"
            )
            for pace in args.steps_per_s:
                print(f"\nthe engine {f'at {pace:g} steps/s' if pace else 'flat out'}:")
                rounds = [
                    one_round(base, proxy, rule, pace, args)
                    for _ in range(args.rounds)
                    for rule in RULES
                ]
                report(rounds)
    finally:
        if server is not None:
            stop(server)
        proxy.close()
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


if __name__ == "__main__":
    main()
