"""The bound on an OpenAI request's body at an engine (`junction serve`) and a router
(`junction route`): its default, its check and its flag, declared without importing a web
library (each command line stays light until it runs). `protocol.body_limit` enforces it.

Its variable is not the control plane's `JUNCTION_MAX_BODY_BYTES` (1 MiB of REST body): compose
gives every part the same `.env`, and an engine bounded at 1 MiB refused prompts of 130,000
token ids."""

from __future__ import annotations

import argparse
import os

#: the most bytes a request body may hold by default (a prompt of a million token ids as JSON
#: is ~8 MB)
DEFAULT_MAX_BODY_BYTES = 32 << 20
MAX_BODY_SETTING = "--max-body-bytes, JUNCTION_OPENAI_MAX_BODY_BYTES"


def positive_bytes(value: str) -> int:
    """`--max-body-bytes`' check: a whole number of bytes above 0."""
    if not value.strip().isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a whole number of bytes above 0 (JUNCTION_OPENAI_MAX_BODY_BYTES)"
        )
    return int(value)


def add_max_body_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-body-bytes",
        type=positive_bytes,
        default=os.environ.get("JUNCTION_OPENAI_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES)),
        metavar="BYTES",
        help="the most bytes a request body may hold; a larger one is answered 413 before it "
        f"is read (default {DEFAULT_MAX_BODY_BYTES:,}; JUNCTION_OPENAI_MAX_BODY_BYTES)",
    )
