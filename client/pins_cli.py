"""`junction pin`, `junction unpin`, `junction pins`: pins through the control plane's REST API.

    junction pin --text "You are ..." --label "system prompt" [--engine ID ...] [--priority N]
    junction pin --file system.txt | --token-ids 1,2,3 | --segments '[{"seed": 1, "len": 560}]'
    junction pin --system "You are ..." --label support  # a chat system message
    junction unpin PIN_ID
    junction pins [--state active|released] [--engine ID]

The control plane's URL comes from `--control-plane` (default `$JUNCTION_CONTROL_PLANE_URL`,
else http://127.0.0.1:8080) and every command sends `--token` (default `$JUNCTION_API_TOKEN`;
`junction pins`, a read, also takes `$JUNCTION_READ_TOKEN`); the defaults are
`client.settings`'s, and a command without a token refuses to run. Exit status: 0 done,
2 refused (the API's message, or what is missing, is printed), 1 the API could not be reached
or failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from client.rest import ApiClient, ApiError
from client.settings import DEFAULT_URL, ControlPlaneSettings
from client.types import PinOut

EXIT_REFUSED = 2
EXIT_FAILED = 1
TIMEOUT_S = 30.0


class CliError(Exception):
    """Input the command cannot send (a file it cannot read, ids that are not integers)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def add_pin_parsers(commands: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--control-plane",
        default=None,
        metavar="URL",
        help=f"the control plane (default: $JUNCTION_CONTROL_PLANE_URL or {DEFAULT_URL})",
    )
    common.add_argument(
        "--token",
        default=None,
        help="bearer token (default: $JUNCTION_API_TOKEN; for `pins`, else $JUNCTION_READ_TOKEN)",
    )
    common.add_argument("--json", action="store_true", help="print the API's JSON answer")

    pin = commands.add_parser(
        "pin",
        parents=[common],
        help="pin a prefix (a system prompt) on the engines",
        description="Pin a prefix: its checkpoint and attention blocks are kept on every target "
        "engine until unpinned. The boundary is the prefix floored to each engine's hit grid.",
    )
    prefix = pin.add_mutually_exclusive_group(required=True)
    prefix.add_argument("--text", help="the prefix as text (its UTF-8 bytes are the tokens)")
    prefix.add_argument("--file", type=Path, help="a file whose text is the prefix")
    prefix.add_argument(
        "--system",
        metavar="TEXT",
        help="a chat system prompt: each engine pins it as its chat template renders it, so "
        "chat requests that start with it hit it",
    )
    prefix.add_argument("--token-ids", metavar="1,2,3", help="the prefix's token ids")
    prefix.add_argument(
        "--segments", metavar="JSON", help='seeded segments: \'[{"seed": 1, "len": 560}]\''
    )
    pin.add_argument("--label", required=True, help="a name for the pin")
    pin.add_argument(
        "--engine",
        action="append",
        dest="engine_ids",
        metavar="ENGINE_ID",
        help="a target engine (repeatable; default: every engine, connected now or later)",
    )
    pin.add_argument("--priority", type=int, default=0, help="higher: sent to engines first")
    pin.set_defaults(func=cmd_pin, cli_name="pin")

    unpin = commands.add_parser("unpin", parents=[common], help="release a pin")
    unpin.add_argument("pin_id")
    unpin.set_defaults(func=cmd_unpin, cli_name="unpin")

    pins = commands.add_parser(
        "pins", parents=[common], help="list the pins, their state on each engine, tokens saved"
    )
    pins.add_argument("--state", choices=("active", "released"), default=None)
    pins.add_argument("--engine", dest="engine_id", default=None, metavar="ENGINE_ID")
    pins.set_defaults(func=cmd_pins, cli_name="pins")


# ---------------------------------------------------------------------------- commands
def cmd_pin(args: argparse.Namespace) -> int:
    try:
        body: dict[str, Any] = {"prefix": prefix_of(args), "label": args.label}
        if args.engine_ids:
            body["engine_ids"] = args.engine_ids
        if args.priority:
            body["priority"] = args.priority
        pin = client(args).create_pin(body)
    except (CliError, ApiError) as exc:
        return fail(args, exc)
    if args.json:
        show(as_json(pin))
        return 0
    boundary = ", ".join(f"{e} {b}" for e, b in pin.boundary.items()) or "no engine yet"
    show(
        f"pinned {pin.pin_id} ({pin.label}): {pin.num_tokens} tokens, "
        f"boundary {boundary}; {pin.state}"
    )
    return 0


def cmd_unpin(args: argparse.Namespace) -> int:
    try:
        pin = client(args).release_pin(args.pin_id)
    except (CliError, ApiError) as exc:
        return fail(args, exc)
    if args.json:
        show(as_json(pin))
    else:
        show(f"released {pin.pin_id} ({pin.label})")
    return 0


def cmd_pins(args: argparse.Namespace) -> int:
    try:
        pins = client(args, is_read=True).pins(state=args.state, engine_id=args.engine_id)
    except (CliError, ApiError) as exc:
        return fail(args, exc)
    if args.json:
        show(as_json(pins))
    else:
        show(pins_table(pins) if pins else "no pins")
    return 0


# ---------------------------------------------------------------------------- helpers
def show(text: str) -> None:
    """Print `text`; a reader that stopped reading (`junction pins | head`) is no error."""
    try:
        print(text, flush=True)  # flushed here: at exit the pipe's error would escape
    except BrokenPipeError:
        # as Python's docs advise: stdout to devnull, so the flush at exit does not fail too
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def prefix_of(args: argparse.Namespace) -> dict[str, Any]:
    if args.text is not None:
        return {"text": args.text}
    if args.system is not None:
        return {"messages": [{"role": "system", "content": args.system}]}
    if args.file is not None:
        try:
            return {"text": args.file.read_text(encoding="utf-8")}
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read {args.file}: {exc}", EXIT_REFUSED) from exc
    if args.token_ids is not None:
        try:
            return {"token_ids": [int(t) for t in args.token_ids.split(",") if t.strip()]}
        except ValueError as exc:
            raise CliError(
                f"--token-ids takes comma-separated integers, got {args.token_ids!r}",
                EXIT_REFUSED,
            ) from exc
    try:
        segments = json.loads(args.segments)
    except json.JSONDecodeError as exc:
        raise CliError(f"--segments is not valid JSON: {exc}", EXIT_REFUSED) from exc
    if isinstance(segments, dict) and "segments" in segments:
        segments = segments["segments"]  # a trace's prompt form, {"segments": [...]}, too
    return {"segments": segments}


#: the file a control plane keeps the token it made in, beside the default SQLite store
TOKEN_FILE_NAME = "junction-api-token"


def client(args: argparse.Namespace, is_read: bool = False) -> ApiClient:
    """The control plane of `--control-plane` and `--token`, else of the settings (a read
    takes the read-only token too); raises `CliError` when there is no token to send."""
    settings = ControlPlaneSettings()
    token = args.token or settings.api_token or (settings.read_token if is_read else None)
    if not token:
        tokens = "JUNCTION_API_TOKEN (or JUNCTION_READ_TOKEN)" if is_read else "JUNCTION_API_TOKEN"
        raise CliError(
            f"no token to send: pass --token or set {tokens} to the control plane's; "
            f"{token_file_hint()}",
            EXIT_REFUSED,
        )
    return ApiClient(args.control_plane or settings.url, token, timeout_s=TIMEOUT_S)


def token_file_hint() -> str:
    """Where the token a local control plane made is (`junction up`, `make run`): the file
    `JUNCTION_API_TOKEN_FILE` names, else `junction-api-token` here, where the default SQLite
    store keeps it; how to send it when it is there, where it would be when not."""
    path = Path(os.environ.get("JUNCTION_API_TOKEN_FILE") or TOKEN_FILE_NAME)
    if path.is_file():
        return f"the one `junction up` made is in {path}: export JUNCTION_API_TOKEN=$(cat {path})"
    return f"a control plane started here keeps the one it made in {path.resolve()}"


def call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    """The JSON answer of `method path` under `/api/v1`; raises `ApiError` saying why not (or
    `CliError` when there is no token to send)."""
    return client(args, is_read=method == "GET").call(method, path, **kwargs)


def fail(args: argparse.Namespace, error: CliError | ApiError) -> int:
    """Say why the command failed; its exit status: refused (bad input, a 4xx) or failed."""
    print(f"junction {args.cli_name}: {error}", file=sys.stderr)
    if isinstance(error, CliError):
        return error.status
    is_refused = error.status is not None and 400 <= error.status < 500
    return EXIT_REFUSED if is_refused else EXIT_FAILED


def as_json(body: PinOut | list[PinOut]) -> str:
    """The API's answer as `--json` prints it: its JSON, indented."""
    return json.dumps(msgspec.to_builtins(body), indent=2)


def pins_table(pins: list[PinOut]) -> str:
    """One line a pin, then one a target engine: its boundary, state (and why, when failed),
    the requests that hit the pin there and the tokens they saved."""
    headers = ["PIN", "LABEL", "TOKENS", "PRIORITY", "STATE", "HITS", "SAVED", "REASON"]
    rows: list[list[str]] = []
    for pin in pins:
        label = pin.label if len(pin.label) <= 24 else pin.label[:23] + "…"
        targets = "all" if pin.targets == "all" else "list"
        rows.append(
            [
                pin.pin_id,
                f"{label} ({pin.origin}, {targets})" if pin.origin != "api" else label,
                str(pin.num_tokens),
                str(pin.priority),
                pin.state,
                str(pin.num_hits),
                str(pin.tokens_saved),
                "",
            ]
        )
        for target in pin.engines:
            boundary = "?" if target.boundary is None else str(target.boundary)
            rows.append(
                [
                    f"  {target.engine_id}",
                    f"boundary {boundary}",
                    "",
                    "",
                    target.state,
                    str(target.num_hits),
                    str(target.tokens_saved),
                    target.reason or "",
                ]
            )
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    right = {2, 3, 5, 6}  # numbers

    def line(row: list[str]) -> str:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return "\n".join(line(row) for row in [headers, *rows])
