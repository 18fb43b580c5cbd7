"""A checkpoint's safetensors into a model's parameters, through the family's name map.

A family maps every parameter of the Junction model to a `Source`: the checkpoint tensors it is
made of, in order, and how they join (one tensor; several concatenated along dim 0, as Bamba's
gate and up projections become one gated `up_proj`; or several stacked along a new dim 0, as
Nemotron-H's per-expert matrices become one [E, ...] tensor, or pairs concatenated, then
stacked, as Qwen's per-expert gate and up projections).

Every check runs on the safetensors headers before one tensor is read, so a bad directory fails
at load, before any request: each shard the index names exists, each tensor a source names is
present, no stored tensor is left over (bar the family's ignored ones), and each has its shape.
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path
from typing import Literal, NamedTuple

import torch
from safetensors import safe_open
from torch import nn

INDEX_FILE = "model.safetensors.index.json"

Join = Literal["one", "cat", "stack"]


class Source(NamedTuple):
    names: tuple[str, ...]  # checkpoint tensors, in the order they join
    join: Join = "one"  # "cat": along dim 0; "stack": along a new dim 0
    shape: tuple[int, ...] | None = None  # each tensor's stored shape; None: from the parameter
    # "stack" only: each stacked item is `per_item` consecutive names concatenated along dim 0
    # (an expert's gate and up projections, stored apart, become its one gated up_proj)
    per_item: int = 1


class StoredTensor(NamedTuple):
    path: Path  # the safetensors file holding it
    shape: tuple[int, ...]


def stored_shape(source: Source, parameter_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape each of `source`'s checkpoint tensors must have."""
    if source.shape is not None:
        return source.shape
    if source.join == "cat":
        return (parameter_shape[0] // len(source.names), *parameter_shape[1:])
    if source.join == "stack":
        return (parameter_shape[1] // source.per_item, *parameter_shape[2:])
    return parameter_shape


def read_headers(model_dir: Path) -> dict[str, StoredTensor]:
    """Every stored tensor's file and shape, from one file or the shards an index names."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        shard_names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [name for name in shard_names if not (model_dir / name).is_file()]
        if missing:
            raise ValueError(
                f"{model_dir}: shard files {missing} named in {INDEX_FILE} are missing"
            )
        paths = [model_dir / name for name in shard_names]
    else:
        paths = sorted(model_dir.glob("*.safetensors"))
        if not paths:
            raise ValueError(f"{model_dir}: no *.safetensors weights and no {INDEX_FILE}")
    stored: dict[str, StoredTensor] = {}
    for path in paths:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                stored[name] = StoredTensor(path, tuple(handle.get_slice(name).get_shape()))
    return stored


def check_sources(
    model: nn.Module,
    sources: dict[str, Source],
    stored: dict[str, StoredTensor],
    ignored: list[str],
    where: Path,
) -> None:
    """Raise, naming the tensors, unless `stored` fills every parameter exactly.

    `ignored`: patterns (regular expressions) of stored tensors the model has no use for.
    """
    parameters = dict(model.named_parameters())
    if parameters.keys() != sources.keys():
        raise ValueError(
            f"name map does not cover the model: parameters without a source "
            f"{sorted(parameters.keys() - sources.keys())}, sources without a parameter "
            f"{sorted(sources.keys() - parameters.keys())}"
        )
    needed = {name for source in sources.values() for name in source.names}
    missing = sorted(needed - stored.keys())
    unexpected = sorted(
        name
        for name in stored.keys() - needed
        if not any(re.search(pattern, name) for pattern in ignored)
    )
    if missing or unexpected:
        raise ValueError(f"{where}: missing tensors {missing}, unexpected tensors {unexpected}")
    for parameter_name, source in sources.items():
        expected = stored_shape(source, tuple(parameters[parameter_name].shape))
        for name in source.names:
            if stored[name].shape != expected:
                raise ValueError(
                    f"{where}: tensor {name} has shape {stored[name].shape}, expected {expected}"
                )


def load_weights(
    model: nn.Module, sources: dict[str, Source], model_dir: Path, ignored: list[str]
) -> None:
    """Check, then fill every parameter of `model` (already on its device and dtype)."""
    stored = read_headers(model_dir)
    check_sources(model, sources, stored, ignored, model_dir)
    parameters = dict(model.named_parameters())
    with ExitStack() as stack, torch.no_grad():
        handles = {
            path: stack.enter_context(safe_open(str(path), framework="pt"))
            for path in {t.path for t in stored.values()}
        }
        for parameter_name, source in sources.items():
            tensors = [handles[stored[name].path].get_tensor(name) for name in source.names]
            if source.join == "cat":
                tensor = torch.cat(tensors)
            elif source.join == "stack":
                k = source.per_item
                tensor = torch.stack(
                    [torch.cat(tensors[i : i + k]) for i in range(0, len(tensors), k)]
                )
            else:
                (tensor,) = tensors
            parameter = parameters[parameter_name]
            parameter.copy_(tensor.reshape(parameter.shape))
