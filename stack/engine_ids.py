"""Which engine ids `junction up` gives its engines. Without a model: `engine-0` (with
`--engines N`, `engine-0` ... `engine-<N-1>`). With `--model DIR`: a slug of the checkpoint's
name (`bamba-9b`; `bamba-9b-0` ... with `--engines N`), so a new model's requests, hit rate and
pins never merge with another model's history under one id in the store. `--engine-id` names
the one engine itself. Every id keeps to the wire's engine id rules (`engine.wire.EngineId`)."""

from __future__ import annotations

import re
from pathlib import PurePath

import msgspec

from engine.wire import EngineId

DEFAULT_BASE = "engine"
MAX_SLUG = 100  # of the wire's 128 characters: room for `-<index>` after it
_NOT_ALLOWED = re.compile(r"[^a-z0-9._-]+")


def model_slug(model: str) -> str:
    """The checkpoint's name as an engine id: its directory's name (a hub id's name after the
    organization; the model's name for a snapshot of the Hugging Face cache, not its commit),
    lowercased, every run of other characters one `-`."""
    path = PurePath(model.rstrip("/\\"))
    name = path.name
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        name = path.parent.parent.name.split("--")[-1]  # models--org--name/snapshots/<commit>
    slug = _NOT_ALLOWED.sub("-", name.lower()).strip("-._")[:MAX_SLUG].rstrip("-._")
    return slug or DEFAULT_BASE


def engine_ids(num_engines: int, model: str | None, engine_id: str | None = None) -> list[str]:
    """The ids of the `num_engines` engines `junction up` starts for `model` (None: the
    built-in one); `engine_id` (`--engine-id`, one engine only) wins."""
    if engine_id is not None:
        ids = [engine_id]
    elif model is None:
        ids = [f"{DEFAULT_BASE}-{index}" for index in range(num_engines)]
    elif num_engines == 1:
        ids = [model_slug(model)]
    else:
        ids = [f"{model_slug(model)}-{index}" for index in range(num_engines)]
    for made in ids:
        try:
            msgspec.convert(made, EngineId)  # the wire's own rule, as a hello is checked
        except msgspec.ValidationError:
            raise ValueError(f"engine id {made!r}: 1 to 128 of A-Za-z0-9._:@-") from None
    return ids
