"""vLLM 0.33's own KV-cache events, published for real: the peer side of `junction attach`.

Runs with `.venv-peer/bin/python`, never with Junction's `.venv` (it imports vLLM and must not
import Junction). It builds vLLM's scheduler and `KVCacheManager` for a hybrid geometry as
`vllm_replay.py` does (an attention group and a Mamba group in one `BlockPool`), with KV events
on: vLLM's scheduler then builds vLLM's own `ZmqEventPublisher` (PUB on `--events`, replay
ROUTER on `--replay`) and publishes one `KVEventBatch` per step. Nothing of vLLM is copied;
the one seam is vLLM's `Scheduler`, subclassed while `build_peer` runs so that the config it
starts from carries a `KVEventsConfig` (`vllm_replay.py` has no option for one).

Commands, one JSON object a line on stdin; answers one a line on stdout (logs on stderr):

    {"cmd": "replay", "requests": [{"id", "prompt_token_ids", "max_tokens"}, ...],
     "concurrency": 1}
        -> {"ok": true, "num_steps": int, "wall_s": float, "num_published": int}
        the requests through vLLM (`num_published`: batches published so far, the next seq)
    {"cmd": "pool"}
        -> {"ok": true, "groups": {"<group_idx>": {"kind": str, "hashes": [hex, ...]}},
            "num_blocks": {"<group_idx>": int}}
        the hashes vLLM's block pool holds now, per group (hex as the bridge writes them:
        bytes as they are, ints as their signed big-endian bytes), after the publisher has
        sent every batch so far
    {"cmd": "flood", "num_batches": int, "events_per_batch": int}
        -> {"ok": true, "num_batches": int, "num_events": int, "wall_s": float}
        the publisher as fast as it goes: batches of synthetic BlockStored / BlockRemoved
        pairs through the same `ZmqEventPublisher` (for benchmarks/bridge.py)
    {"cmd": "quit"} -> {"ok": true}

Usage:
    .venv-peer/bin/python benchmarks/peer/vllm_kv_events.py --events tcp://*:5557
        [--replay tcp://127.0.0.1:5558] [--buffer-steps N] [--block-size 16]
        [--mamba-block-size 256] [--num-blocks 300] [--num-mamba-blocks 40]
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from vllm_replay import Geometry, Replay, build_peer  # noqa: E402


def hash_hex(h: bytes | int) -> str:
    if isinstance(h, bytes):
        return h.hex()
    return h.to_bytes(max(1, (h.bit_length() + 8) // 8), "big", signed=True).hex()


def build(geometry: Geometry, events: str, replay: str | None, buffer_steps: int):
    """`build_peer(geometry)` with vLLM's KV events on, published over ZeroMQ."""
    from vllm.config.kv_events import KVEventsConfig
    from vllm.v1.core.sched import scheduler as scheduler_module

    config = KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=events,
        replay_endpoint=replay,
        buffer_steps=buffer_steps,
    )
    real = scheduler_module.Scheduler

    class WithEvents(real):
        """vLLM's scheduler, its config carrying the KV events config before it starts."""

        def __init__(self, *args, **kwargs):
            vllm_config = kwargs["vllm_config"]
            object.__setattr__(vllm_config, "kv_events_config", config)  # as build_peer's stubs
            super().__init__(*args, **kwargs)

    scheduler_module.Scheduler = WithEvents
    try:
        return build_peer(geometry)
    finally:
        scheduler_module.Scheduler = real


def wait_published(publisher, timeout_s: float = 30.0) -> None:
    """Until vLLM's publisher thread has sent everything queued (its queue's unfinished
    count: `task_done` follows the send)."""
    deadline = time.monotonic() + timeout_s
    queue = publisher._event_queue
    while queue.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.01)


def pool_hashes(peer) -> dict:
    from vllm.v1.core.kv_cache_utils import (
        get_block_hash,
        get_group_id,
        maybe_convert_block_hash,
    )
    from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

    manager = peer.scheduler.kv_cache_manager
    groups = manager.kv_cache_config.kv_cache_groups
    found = {
        str(i): {"kind": get_kv_cache_spec_kind(g.kv_cache_spec).value, "hashes": []}
        for i, g in enumerate(groups)
    }
    num_blocks = dict.fromkeys(found, 0)
    for key, blocks in manager.block_pool.cached_block_hash_to_block._cache.items():
        group = str(get_group_id(key))
        found[group]["hashes"].append(hash_hex(maybe_convert_block_hash(get_block_hash(key))))
        num_blocks[group] += len(blocks) if isinstance(blocks, dict) else 1
    for group in found.values():
        group["hashes"].sort()
    return {"ok": True, "groups": found, "num_blocks": num_blocks}


def flood(publisher, num_batches: int, events_per_batch: int) -> dict:
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

    started = time.perf_counter()
    num_events = 0
    for n in range(num_batches):
        events = []
        for i in range(events_per_batch // 2):
            h = ((n * events_per_batch + i) * 2654435761 % (1 << 63)).to_bytes(32, "big")
            events.append(
                BlockStored(
                    block_hashes=[h],
                    parent_block_hash=None,
                    token_ids=list(range(16)),
                    block_size=16,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                    group_idx=0,
                    kv_cache_spec_kind="full_attention",
                )
            )
            events.append(BlockRemoved(block_hashes=[h], medium="GPU", group_idx=0))
        num_events += len(events)
        publisher.publish(KVEventBatch(ts=time.time(), events=events))
    wait_published(publisher, 300.0)
    wall_s = time.perf_counter() - started
    return {"ok": True, "num_batches": num_batches, "num_events": num_events, "wall_s": wall_s}


class Counted:
    """Counts the batches handed to vLLM's publisher (its seqs are 0, 1, ... in this order)."""

    def __init__(self, publisher) -> None:
        self.num_published = 0
        self.publish = publisher.publish
        publisher.publish = self

    def __call__(self, batch) -> None:
        self.publish(batch)
        self.num_published += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm_kv_events", description=__doc__.split("\n")[0])
    parser.add_argument("--events", default="tcp://*:5557")
    parser.add_argument("--replay", default=None)
    parser.add_argument("--buffer-steps", type=int, default=10_000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--mamba-block-size", type=int, default=256)
    parser.add_argument("--prefix-match-unit", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=300)
    parser.add_argument("--num-mamba-blocks", type=int, default=40)
    args = parser.parse_args(argv)
    geometry = Geometry(
        block_size=args.block_size,
        mamba_block_size=args.mamba_block_size,
        prefix_match_unit=args.prefix_match_unit,
        num_blocks=args.num_blocks,
        num_mamba_blocks=args.num_mamba_blocks,
    )
    peer = build(geometry, args.events, args.replay, args.buffer_steps)
    publisher = peer.scheduler.kv_event_publisher
    counted = Counted(publisher)
    answer_line({"ok": True, "ready": True, "events": args.events, "replay": args.replay})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            command = json.loads(line)
            name = command.get("cmd")
            if name == "quit":
                answer_line({"ok": True})
                break
            if name == "replay":
                replay = Replay(peer)
                started = time.perf_counter()
                replay.run(command["requests"], int(command.get("concurrency", 1)))
                wait_published(publisher)
                answer = {
                    "ok": True,
                    "num_steps": replay.num_steps,
                    "wall_s": time.perf_counter() - started,
                    "num_published": counted.num_published,
                }
            elif name == "pool":
                wait_published(publisher)
                answer = {**pool_hashes(peer), "num_published": counted.num_published}
            elif name == "flood":
                answer = flood(
                    publisher, int(command["num_batches"]), int(command["events_per_batch"])
                )
            else:
                raise ValueError(f"unknown cmd {name!r} (replay, pool, flood, quit)")
        except Exception as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answer_line(answer)
    publisher.shutdown()
    return 0


def answer_line(answer: dict) -> None:
    sys.stdout.write(json.dumps(answer, separators=(",", ":")) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
