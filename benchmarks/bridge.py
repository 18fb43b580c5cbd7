"""How fast `junction attach` decodes and translates a real vLLM publisher's KV events.

vLLM 0.33's own `ZmqEventPublisher` (benchmarks/peer/vllm_kv_events.py, in `.venv-peer`)
publishes `--num-batches` batches of `--events-per-batch` events (BlockStored / BlockRemoved
pairs) as fast as it can; the bridge (`attach.bridge.Bridge`, in this process, on its own
thread) consumes them: msgspec decode, translation to Junction's `Peer*` events, the table.
The sink only counts, so what is measured is the bridge, not the control plane. Printed:
events/s over the bridge's busy time, and how many batches were lost (never applied),
filled from the replay, or resynced.

    .venv/bin/python benchmarks/bridge.py [--num-batches 20000] [--events-per-batch 50]
        [--no-replay] [--hwm 100000]

`KvEventsPeer` (the driver as a subprocess) is what tests/peer/test_kv_events_bridge.py
drives too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.peer.client import peer_python  # noqa: E402
from benchmarks.ports import free_port  # noqa: E402

DRIVER = REPO / "benchmarks" / "peer" / "vllm_kv_events.py"


class KvEventsPeer:
    """vLLM's scheduler with KV events on, publishing on loopback (`vllm_kv_events.py`)."""

    def __init__(
        self,
        replay: bool = True,
        *options: str,
        ports: tuple[int, int] | None = None,
        ready_timeout_s: float = 300,
    ) -> None:
        """`ports`: the PUB's and the replay's (default: free ones)."""
        python = peer_python()
        if python is None:
            raise RuntimeError("no .venv-peer: run `make peer`")
        self.events_port, self.replay_port = ports or (free_port(), free_port())
        self.events_url = f"tcp://127.0.0.1:{self.events_port}"
        self.replay_url = f"tcp://127.0.0.1:{self.replay_port}" if replay else None
        command = [str(python), str(DRIVER), "--events", f"tcp://*:{self.events_port}"]
        if replay:
            command += ["--replay", self.replay_url]
        self.process = subprocess.Popen(
            [*command, *options],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
        )
        ready = self._read(ready_timeout_s)
        if not ready.get("ready"):
            raise RuntimeError(f"the driver did not start: {ready}")

    def _read(self, timeout_s: float) -> dict:
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.process.stdout.readline()))
        reader.start()
        reader.join(timeout_s)
        if not result or not result[0]:
            raise RuntimeError(f"the driver gave no answer in {timeout_s:g} s")
        return json.loads(result[0])

    def call(self, command: dict, timeout_s: float = 600) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        answer = self._read(timeout_s)
        if not answer.get("ok"):
            raise RuntimeError(f"the driver refused {command.get('cmd')}: {answer.get('error')}")
        return answer

    def replay(self, requests: list[dict], concurrency: int = 1) -> dict:
        return self.call({"cmd": "replay", "requests": requests, "concurrency": concurrency})

    def pool(self) -> dict:
        """vLLM's pool now: `{group_idx: {"kind", "hashes"}}` and `num_published`."""
        return self.call({"cmd": "pool"})

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.call({"cmd": "quit"}, timeout_s=10)
            except (RuntimeError, OSError):
                pass
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def __enter__(self) -> KvEventsPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure(num_batches: int, events_per_batch: int, use_replay: bool, hwm: int) -> dict:
    from attach.bridge.bridge import Bridge, BridgeConfig

    counted = {"events": 0, "first": None, "last": None}

    def sink(events: list) -> None:
        if events:
            now = time.perf_counter()
            counted["first"] = counted["first"] or now
            counted["last"] = now
            counted["events"] += len(events)

    with KvEventsPeer(use_replay) as peer:
        config = BridgeConfig(events=peer.events_url, replay=peer.replay_url, hwm=hwm)
        bridge = Bridge(config, sink)
        bridge.start()
        time.sleep(1.0)  # the subscription reaches the PUB (a PUB drops what comes before)
        flood = peer.call(
            {"cmd": "flood", "num_batches": num_batches, "events_per_batch": events_per_batch}
        )
        stats = bridge.stats
        applied = 0.0
        for _ in range(600):  # until the bridge stops making progress
            time.sleep(0.5)
            now_applied = stats.value("junction_bridge_batches_total", rank="0")
            if now_applied >= num_batches or (now_applied == applied and applied):
                break
            applied = now_applied
        bridge.stop()
    applied = stats.value("junction_bridge_batches_total", rank="0")
    events = stats.value("junction_bridge_events_total", rank="0")
    busy_s = (counted["last"] or 0) - (counted["first"] or 0)
    resynced = sum(
        m.value
        for m in stats.resyncs.collect()[0].samples
        if m.name.endswith("_total") and m.labels["rank"] == "0"
    )
    return {
        "num_batches": num_batches,
        "events_per_batch": events_per_batch,
        "replay": use_replay,
        "published_events": flood["num_events"],
        "publish_s": round(flood["wall_s"], 3),
        "publish_events_per_s": round(flood["num_events"] / flood["wall_s"]),
        "decoded_events": int(events),
        "bridge_busy_s": round(busy_s, 3),
        "bridge_events_per_s": round(events / busy_s) if busy_s else None,
        "batches_applied": int(applied),
        "batches_lost": num_batches - int(applied),
        "batches_from_replay": int(stats.value("junction_bridge_replayed_batches_total", rank="0")),
        "gaps": int(stats.value("junction_bridge_gaps_total", rank="0")),
        "resyncs": int(resynced),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-batches", type=int, default=20_000)
    parser.add_argument("--events-per-batch", type=int, default=50)
    parser.add_argument("--no-replay", action="store_true")
    parser.add_argument("--hwm", type=int, default=100_000)
    args = parser.parse_args(argv)
    result = measure(args.num_batches, args.events_per_batch, not args.no_replay, args.hwm)
    for key, value in result.items():
        print(f"{key:>22}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
