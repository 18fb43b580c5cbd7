"""The engine server's bounds that its command line sets, declared without importing a web
library (`serve/cli.py` stays light until it runs)."""

from __future__ import annotations

import argparse

#: the most bytes a request body may hold (a prompt of a million token ids as JSON is ~8 MB)
DEFAULT_MAX_BODY_BYTES = 32 << 20
MAX_BODY_SETTING = "--max-body-bytes, JUNCTION_MAX_BODY_BYTES"


def positive_bytes(value: str) -> int:
    """`--max-body-bytes`' check: a whole number of bytes above 0."""
    if not value.strip().isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a whole number of bytes above 0 (JUNCTION_MAX_BODY_BYTES)"
        )
    return int(value)
