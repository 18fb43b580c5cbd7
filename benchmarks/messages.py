"""An agent trace through Anthropic's Messages API, with cache breakpoints and without, side by
side in one run: the hit tokens Anthropic's usage reports and the prefill tokens left to
compute.

The trace: `--agents` agents share one tool list (`--tools-tokens` of tool specs) and each
has a system prompt of its own; each runs `--turns` turns, a turn appending the assistant's
tool call and the tool's result (`--result-tokens`) to its conversation, the agents' turns
interleaved, so the engine's pools (`--num-blocks`, small) hold only part of what all agents
would reuse. With breakpoints the client marks, as Anthropic's guide for agents says, the
last tool (the shared prefix), the system prompt, and the newest tool result (moved forward
each turn); each is kept as a checkpoint and pinned for its TTL. Without them the engine
still caches by its own rules (every message's end is a checkpoint). Each mode runs on its
own fresh `junction serve` (null runner, byte tokenizer), started here.

    .venv/bin/python benchmarks/messages.py [--agents 12] [--turns 8] [--num-blocks 900]
"""

from __future__ import annotations

import argparse
import random
import socket
import string
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import anthropic
import httpx

REPO = Path(__file__).resolve().parents[1]
MODEL = "junction-bench"
EPHEMERAL = {"type": "ephemeral"}


def text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(string.ascii_letters + " ") for _ in range(length))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def engine(num_blocks: int, pin_max_share: float):
    """A fresh `junction serve` on the null runner; its base URL."""
    port = free_port()
    argv = [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--runner", "null"]
    argv += ["--model-name", MODEL, "--num-blocks", str(num_blocks), "--host-cache-bytes", "0"]
    argv += ["--pin-max-share", str(pin_max_share), "--log-level", "warning"]
    process = subprocess.Popen(argv, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise RuntimeError("junction serve did not come up in 60 s")
        yield url
    finally:
        process.terminate()
        process.wait(30)


def agents(args: argparse.Namespace) -> tuple[list[dict], list[str], list[list[list[dict]]]]:
    """The shared tools, each agent's system prompt, and each agent's turns (the blocks each
    turn appends: the assistant's tool call, then the user's tool result)."""
    rng = random.Random(args.seed)
    per_tool = args.tools_tokens // 4
    tools = [
        {"name": f"tool_{i}", "description": text(rng, per_tool), "input_schema": {}}
        for i in range(4)
    ]
    systems = [text(rng, args.system_tokens) for _ in range(args.agents)]
    turns = [
        [
            [
                {"type": "tool_use", "id": f"call_{a}_{t}", "name": "tool_0", "input": {"t": t}},
                {"type": "tool_result", "tool_use_id": f"call_{a}_{t}"},
                text(rng, args.result_tokens),
            ]
            for t in range(args.turns)
        ]
        for a in range(args.agents)
    ]
    return tools, systems, turns


def conversation(task: str, turns: list, upto: int, marked: bool) -> list[dict]:
    """An agent's messages before its turn `upto`: the task, then each turn's call and result;
    with `marked`, the newest result carries the breakpoint."""
    messages = [{"role": "user", "content": task}]
    for t, (call, result, output) in enumerate(turns[:upto]):
        messages.append({"role": "assistant", "content": [call]})
        block = {**result, "content": output}
        if marked and t == upto - 1:
            block["cache_control"] = EPHEMERAL
        messages.append({"role": "user", "content": [block]})
    return messages


def run(url: str, args: argparse.Namespace, marked: bool) -> dict:
    tools, systems, turns = agents(args)
    if marked:
        tools = [*tools[:-1], {**tools[-1], "cache_control": EPHEMERAL}]
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    totals = {"requests": 0, "prompt": 0, "read": 0, "created": 0}
    for upto in range(1, args.turns + 1):
        for a in range(args.agents):
            system = [{"type": "text", "text": systems[a]}]
            if marked:
                system[0]["cache_control"] = EPHEMERAL
            reply = client.messages.create(
                model=MODEL,
                max_tokens=1,
                tools=tools,
                system=system,
                messages=conversation(f"task {a}", turns[a], upto, marked),
            )
            usage = reply.usage
            totals["requests"] += 1
            totals["read"] += usage.cache_read_input_tokens
            totals["created"] += usage.cache_creation_input_tokens
            totals["prompt"] += (
                usage.input_tokens
                + usage.cache_read_input_tokens
                + usage.cache_creation_input_tokens
            )
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=12)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tools-tokens", type=int, default=1500)
    parser.add_argument("--system-tokens", type=int, default=700)
    parser.add_argument("--result-tokens", type=int, default=300)
    parser.add_argument("--num-blocks", type=int, default=900, help="16-token attention blocks")
    parser.add_argument("--pin-max-share", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    results = {}
    for name, marked in (("without breakpoints", False), ("with breakpoints", True)):
        with engine(args.num_blocks, args.pin_max_share) as url:
            started = time.monotonic()
            results[name] = run(url, args, marked)
            results[name]["seconds"] = time.monotonic() - started
    print(
        f"{args.agents} agents x {args.turns} turns, {args.num_blocks} attention blocks of 16 "
        f"tokens, null runner\n"
    )
    print(f"{'':22}{'requests':>9}{'prompt':>10}{'hit (read)':>12}{'prefill':>10}{'created':>9}")
    for name, r in results.items():
        prefill = r["prompt"] - r["read"]
        print(
            f"{name:22}{r['requests']:>9}{r['prompt']:>10}{r['read']:>12}{prefill:>10}"
            f"{r['created']:>9}"
        )
    plain, marked = results["without breakpoints"], results["with breakpoints"]
    print(
        f"\nwith / without: hit tokens {marked['read'] / max(plain['read'], 1):.2f}x, prefill "
        f"tokens {(marked['prompt'] - marked['read']) / (plain['prompt'] - plain['read']):.2f}x"
    )


if __name__ == "__main__":
    main()
