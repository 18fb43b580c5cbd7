"""Junction's side of the vLLM peer: expands traces and talks to `vllm_replay.py`.

Runs in Junction's `.venv`; the peer runs in `.venv-peer` (`make peer`) as a subprocess, so
the two environments never mix. `run_peer_replay` is one process per call (it pays vLLM's
import, ~10 s on two cores); `PeerProcess` keeps one `serve` process for many commands (the
protocol is in `vllm_replay.py`'s docstring).

    with PeerProcess() as peer:
        records = peer.replay(expand_trace("trace.jsonl"), {"block_size": 16}, concurrency=4)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from engine.traces.trace import TracePin, TraceRequest, read_trace

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().with_name("vllm_replay.py")
PEER_VENV = REPO / ".venv-peer"

# `geometry` keys map to the driver's options; values of True become bare flags.
_FLAG_OPTIONS = {"eagle": "--eagle"}


class PeerError(RuntimeError):
    """The peer refused a command or died; the message carries its error."""


def peer_python() -> Path | None:
    """The peer venv's interpreter, or None when `make peer` has not built it."""
    python = PEER_VENV / "bin" / "python"
    return python if python.exists() else None


def expand_trace(path: str | Path) -> list[dict]:
    """A Junction trace as the peer's expanded requests, in trace order. Pin lines are
    skipped with a note on stderr: vLLM has no pins."""
    expanded: list[dict] = []
    for item in read_trace(path):
        if isinstance(item, TracePin):
            print(
                f"peer: {path} line {item.line}: pin {item.pin_id!r} skipped (vLLM has no pins)",
                file=sys.stderr,
            )
            continue
        expanded.append(expanded_request(item))
    return expanded


def expanded_request(item: TraceRequest) -> dict:
    request = {
        "id": item.request_id,
        "prompt_token_ids": list(item.token_ids),
        "max_tokens": item.max_tokens,
    }
    if item.cache_salt is not None:
        request["cache_salt"] = item.cache_salt
    return request


def geometry_options(geometry: dict) -> list[str]:
    """`{"block_size": 64, "partial_hits": False}` as `--block-size 64 --no-partial-hits`
    (`retention_interval` None, dense retention, as `--retention-interval dense`)."""
    options: list[str] = []
    for key, value in geometry.items():
        if key == "partial_hits":
            if not value:
                options.append("--no-partial-hits")
        elif key in _FLAG_OPTIONS:
            if value:
                options.append(_FLAG_OPTIONS[key])
        elif key == "retention_interval":
            options += ["--retention-interval", "dense" if value is None else str(value)]
        elif value is not None:
            options += [f"--{key.replace('_', '-')}", str(value)]
    return options


def _require_python() -> Path:
    python = peer_python()
    if python is None:
        raise PeerError(f"no peer environment at {PEER_VENV}: run `make peer`")
    return python


def run_peer_replay(
    requests: Sequence[dict], geometry: dict | None = None, concurrency: int = 1
) -> list[dict]:
    """Replay expanded requests through vLLM in a fresh peer process; one record a request,
    in order. Raises `PeerError` with the peer's message when it refuses (exit 2) or fails."""
    python = _require_python()
    with tempfile.TemporaryDirectory(prefix="junction-peer-") as tmp:
        trace = Path(tmp) / "trace.jsonl"
        out = Path(tmp) / "out.jsonl"
        trace.write_text("".join(json.dumps(r) + "\n" for r in requests), encoding="utf-8")
        command = [
            str(python),
            str(DRIVER),
            "replay",
            str(trace),
            "--out",
            str(out),
            "--concurrency",
            str(concurrency),
            *geometry_options(geometry or {}),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            message = done.stderr.strip().splitlines()
            raise PeerError(
                f"peer replay exited {done.returncode}: "
                + (message[-1] if message else "no message")
            )
        return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


class PeerProcess:
    """One long-lived `vllm_replay.py serve` process: vLLM is imported once, then every
    command is a line each way. Use as a context manager; `close` ends the process."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> PeerProcess:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        python = _require_python()
        self._process = subprocess.Popen(
            [str(python), str(DRIVER), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.version = self.command({"cmd": "ping"})["vllm"]

    def command(self, command: dict) -> dict:
        """Send one command and return its answer; raises `PeerError` if it failed."""
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise PeerError("the peer process is not running")
        try:
            process.stdin.write(json.dumps(command, separators=(",", ":")) + "\n")
            process.stdin.flush()
        except BrokenPipeError as exc:
            raise PeerError(f"the peer process died (exit {process.poll()})") from exc
        line = process.stdout.readline()
        if not line:
            raise PeerError(f"the peer process died (exit {process.wait()})")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise PeerError(answer.get("error", "the peer refused the command"))
        return answer

    def hash(self, prompts: Sequence[Sequence[int]], unit: int) -> dict:
        """vLLM's request block hashing per prompt: `{"ns": [...], "num_hashes": [...]}`."""
        return self.command({"cmd": "hash", "prompts": [list(p) for p in prompts], "unit": unit})

    def lookup(
        self,
        geometry: dict,
        warm_prompts: Sequence[Sequence[int]],
        prompts: Sequence[Sequence[int]],
    ) -> dict:
        """Warm a fresh cache, then one timed lookup per prompt:
        `{"ns": [...], "hit_tokens": [...]}`."""
        return self.command(
            {
                "cmd": "lookup",
                "geometry": geometry,
                "warm_prompts": [list(p) for p in warm_prompts],
                "prompts": [list(p) for p in prompts],
            }
        )

    def replay(
        self, requests: Sequence[dict], geometry: dict | None = None, concurrency: int = 1
    ) -> list[dict]:
        return self.replay_timed(requests, geometry, concurrency)["records"]

    def replay_timed(
        self,
        requests: Sequence[dict],
        geometry: dict | None = None,
        concurrency: int = 1,
        loop: str = "scheduler",
    ) -> dict:
        """`{"records": [...], "wall_s": loop seconds, "num_steps": n}`; `loop` "manager" runs
        vLLM's `KVCacheManager` in the peer's minimal step loop instead of its `Scheduler`."""
        if loop not in ("scheduler", "manager"):
            raise ValueError(f"loop must be scheduler or manager, got {loop!r}")
        return self.command(
            {
                "cmd": "replay" if loop == "scheduler" else "manager_replay",
                "geometry": geometry or {},
                "requests": list(requests),
                "concurrency": concurrency,
            }
        )

    def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.stdin is not None and process.poll() is None:
                process.stdin.write('{"cmd":"quit"}\n')
                process.stdin.close()
            process.wait(timeout=10)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        finally:
            if process.stdout is not None:
                process.stdout.close()
