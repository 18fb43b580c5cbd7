"""`--model`: a local Hugging Face-format directory, or a hub id already in the local Hugging
Face cache. Nothing is ever downloaded: these machines have no hub access."""

from __future__ import annotations

import json
from pathlib import Path


def resolve_model_dir(
    value: str, option: str = "--model", cache_dir: str | Path | None = None
) -> str:
    """The directory `value` names: itself when it is one, else the cached snapshot of the hub
    id `value` (in `cache_dir`, default the Hugging Face cache); `ValueError` naming `option`
    (the option or field that gave it) when it is neither."""
    path = Path(value).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"{option} {value}: no config.json in that directory; pass a Hugging Face "
                f"model directory (config.json, *.safetensors, tokenizer files)"
            )
        return str(path.resolve())
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return snapshot_download(value, cache_dir=cache_dir, local_files_only=True)
    except (HFValidationError, LocalEntryNotFoundError, OSError):
        raise ValueError(
            f"{option} {value}: no such directory, nor a model in the local Hugging Face cache; "
            f"nothing is downloaded here: pass the directory of a downloaded checkpoint"
        ) from None


def checkpoint_max_len(model_dir: str | Path) -> int | None:
    """The longest sequence the checkpoint's config.json says it takes
    (`max_position_embeddings`, a multimodal model's in `text_config`); None when it says
    none. Reads the file only."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    for section in (config, config.get("text_config") or {}):
        value = section.get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    return None
