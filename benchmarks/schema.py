"""The event schema before and after msgspec, in one process, on the same 1000 events.

The events are a ledger engine's own (a pinned system prompt, then requests on shared prefixes
under a small cache: `BlockStored`, `BlockRemoved`, `BlockStateChanged` with its rows,
`BlockCopied`, `RequestFinished`, `PinUpdated` ...), cut into batch frames of `--batch`
events as the publisher sends them. Per 1000 events, best of `--repeat`:

- build: each event made again from its fields (what the pool and scheduler do on every cache
  change while a sink records);
- encode: the batch frames to JSON text and to msgpack (before: `to_dict` per event, then
  `json.dumps` / `msgpack.packb`; after: the structs straight to msgspec's encoders);
- decode + validate: the frames back into validated frames (before: pydantic; after: msgspec).

"Before" is the tree before the change, its `engine/events.py` and `engine/wire.py` loaded by
path under other module names (make it with `git worktree add --detach /tmp/junction-before
<commit>`); its frames are checked to decode into what the new ones do.

    .venv/bin/python benchmarks/schema.py [--before /tmp/junction-before] [--repeat 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from msgspec import structs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.config import CacheConfig  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.wire import Batch, decode, encode  # noqa: E402

NUM_EVENTS = 1000


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pydantic look their module up by name
    spec.loader.exec_module(module)
    return module


def engine_events(num: int) -> list:
    """A ledger engine's first `num` events (it serves requests until it has emitted them)."""
    rng = random.Random(0)
    engine = Engine(CacheConfig(num_blocks=256), runner="ledger", engine_id="bench-schema")
    prefixes = [[rng.randrange(256) for _ in range(rng.choice((300, 600)))] for _ in range(4)]
    engine.pin("system", prefixes[0])
    engine.run_until_done()
    while len(engine.sink.events) < num:
        for _ in range(4):
            tail = [rng.randrange(256) for _ in range(rng.randrange(20, 200))]
            engine.add_request(rng.choice(prefixes) + tail)
        engine.run_until_done()
    return engine.sink.events[:num]


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3  # each call handles the NUM_EVENTS events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, default=Path("/tmp/junction-before"))
    parser.add_argument("--batch", type=int, default=50, help="events per frame")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    if not (args.before / "engine" / "wire.py").exists():
        sys.exit(f"no tree at {args.before}: git worktree add --detach {args.before} <commit>")
    old_events = load(args.before / "engine" / "events.py", "before_events")
    old_wire = load(args.before / "engine" / "wire.py", "before_wire")

    events = engine_events(NUM_EVENTS)
    kinds: dict[str, int] = {}
    for event in events:
        kinds[event.type] = kinds.get(event.type, 0) + 1
    fields = [(type(e), getattr(old_events, e.type), structs.asdict(e)) for e in events]
    old = [old_cls(**kwargs) for _, old_cls, kwargs in fields]
    cuts = range(0, NUM_EVENTS, args.batch)
    head = {"engine_id": "bench-schema", "epoch": 0, "ts": 1.7e9}

    def old_frames(binary: bool) -> list:
        return [
            old_wire.encode({"type": "batch", **head, "seq": i, "events": batch}, binary)
            for i, s in enumerate(cuts)
            if (batch := [e.to_dict() for e in old[s : s + args.batch]]) is not None
        ]

    def new_frames(binary: bool) -> list:
        return [
            encode(Batch(**head, seq=i, events=events[s : s + args.batch]), binary)
            for i, s in enumerate(cuts)
        ]

    rows: list[tuple[str, float, float]] = [
        (
            "build",
            best_ms(lambda: [old_cls(**kw) for _, old_cls, kw in fields], args.repeat),
            best_ms(lambda: [new_cls(**kw) for new_cls, _, kw in fields], args.repeat),
        )
    ]
    for binary, kind in ((False, "JSON"), (True, "msgpack")):
        before, after = old_frames(binary), new_frames(binary)
        # the same frames either way: the new decoder reads the old frames as it reads its own
        assert [encode(decode(f)) for f in before] == [encode(decode(f)) for f in after]
        encode_row = (
            f"encode {kind}",
            best_ms(lambda b=binary: old_frames(b), args.repeat),
            best_ms(lambda b=binary: new_frames(b), args.repeat),
        )
        decode_row = (
            f"decode + validate {kind}",
            best_ms(lambda f=before: [old_wire.decode(x) for x in f], args.repeat),
            best_ms(lambda f=after: [decode(x) for x in f], args.repeat),
        )
        rows += [encode_row, decode_row]
        total = (encode_row[1] + decode_row[1], encode_row[2] + decode_row[2])
        rows.append((f"encode + decode + validate {kind}", *total))

    mix = ", ".join(f"{count} {name}" for name, count in sorted(kinds.items()))
    print(f"{NUM_EVENTS} engine events ({mix}), {len(cuts)} frames of {args.batch}")
    print(f"ms per {NUM_EVENTS} events, best of {args.repeat}; before: {args.before}")
    print(f"  {'':36} {'before':>8} {'after':>8} {'before/after':>13}")
    for name, before_ms, after_ms in rows:
        print(f"  {name:36} {before_ms:8.2f} {after_ms:8.2f} {before_ms / after_ms:12.1f}x")


if __name__ == "__main__":
    main()
