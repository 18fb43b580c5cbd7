"""The disk tier's fingerprint: the model and cache geometry a directory's units were written
for, so that a restart on the same directory trusts them and another model never reads them.

The directory's `fingerprint.json` holds the geometry (any JSON-able dict the engine passes)
and its hash. A fresh or empty directory takes the fingerprint; one whose fingerprint differs,
or that holds units but no fingerprint, is refused with a `ValueError` naming `--disk-cache-dir`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

FINGERPRINT_FILE = "fingerprint.json"
FLAG = "--disk-cache-dir"


def fingerprint_hash(geometry: dict) -> str:
    """The hash of a geometry: its canonical JSON (sorted keys) through blake2b."""
    text = json.dumps(geometry, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def claim(directory: Path, geometry: dict, has_units: bool) -> None:
    """Write `geometry` as the directory's fingerprint if it has none and holds no units;
    otherwise check it is the same. Raises `ValueError` saying what differs and what to do."""
    path = directory / FINGERPRINT_FILE
    if not path.exists():
        if has_units:
            raise ValueError(
                f"{FLAG} {directory}: holds cache units but no {FINGERPRINT_FILE}, so what "
                f"model they were written for is unknown; pass an empty directory or a new one"
            )
        record = {"hash": fingerprint_hash(geometry), "geometry": geometry}
        write_atomically(path, json.dumps(record, sort_keys=True, indent=1).encode())
        return
    try:
        stored = json.loads(path.read_text())
        stored_hash, stored_geometry = stored["hash"], stored["geometry"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{FLAG} {directory}: unreadable {FINGERPRINT_FILE} ({error!r}); "
            f"pass an empty directory or a new one"
        ) from None
    if stored_hash != fingerprint_hash(geometry):
        raise ValueError(
            f"{FLAG} {directory}: written for another model or cache geometry "
            f"({differences(stored_geometry, geometry)}); pass the directory that model's "
            f"engine used, or an empty or new one"
        )


def differences(stored: object, current: dict) -> str:
    """`name: stored -> current` for each field that differs, for the refusal's message."""
    if not isinstance(stored, dict):
        return f"stored fingerprint {stored!r}"
    names = sorted(set(stored) | set(current))
    changed = [
        f"{name}: {stored.get(name, '(none)')!r} -> {current.get(name, '(none)')!r}"
        for name in names
        if stored.get(name) != current.get(name)
    ]
    return "; ".join(changed) or "same fields, different hash"


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temp file beside `path`, then rename it over `path`: a reader or a crash
    sees the old file or the new one, never part of one. Several writers may race; the last
    rename wins, whole."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with temp.open("wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
