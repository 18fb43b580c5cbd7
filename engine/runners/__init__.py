"""Runners execute a scheduled step: save units to the tiers, zero new blocks, run the copies in
order, load units from the tiers, then forward."""

from __future__ import annotations

from engine.config import CacheConfig, ModelConfig
from engine.modes import RUNNER_NAMES
from engine.runners.base import Runner


def make_runner(name: str, cache_config: CacheConfig, model_config: ModelConfig) -> Runner:
    """Build a runner by name; an unknown name gets an error listing the known ones."""
    if name == "null":
        from engine.runners.null import NullRunner

        return NullRunner(model_config, cache_config.attention_block_size)
    if name == "ledger":
        from engine.runners.ledger import LedgerRunner

        return LedgerRunner(cache_config, model_config)
    if name == "torch":
        from engine.runners.torch_runner import TorchRunner

        return TorchRunner(cache_config, model_config)
    raise ValueError(f"unknown runner {name!r}: choose one of {', '.join(RUNNER_NAMES)}")
