"""What each cache group is called on an engine's pages.

The store and the events name the recurrent-state group `mamba` whatever layers fill it. A
Qwen3.5 or Qwen3-Next engine fills it with Gated DeltaNet states, and its hello's model card
says so (`state_group`: "linear"); the pages then call the group by what it holds, keeping the
stored name beside it so that it can be found in the REST API.
"""

from __future__ import annotations

from client.schema import MAMBA, STATE_LAYERS
from client.types import EngineOut
from dashboard.model_view import card_of

__all__ = ["STATE_LAYERS", "group_label", "state_kind"]


def state_kind(engine: EngineOut | None) -> str:
    """ "mamba" or "linear": what the engine's state group holds (built-in engines: mamba)."""
    return card_of(engine).state_group or "mamba"


def group_label(engine: EngineOut | None, group: str) -> str:
    """`group` as the engine's pages show it: `linear (mamba)` for a Gated DeltaNet model."""
    kind = state_kind(engine)
    if group != MAMBA or kind == "mamba":
        return group
    return f"{kind} ({group})"
