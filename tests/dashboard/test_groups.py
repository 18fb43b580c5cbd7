"""The pages name the state group by what fills it, from the engine's model card."""

from __future__ import annotations

from client.types import EngineOut
from dashboard.groups import group_label, state_kind
from tests.dashboard.bodies import body

QWEN = body(
    EngineOut,
    {"engine_id": "q", "model": {"architecture": "Qwen3_5ForCausalLM", "state_group": "linear"}},
)
BAMBA = body(
    EngineOut,
    {"engine_id": "b", "model": {"architecture": "BambaForCausalLM", "state_group": "mamba"}},
)
OLD = body(EngineOut, {"engine_id": "o", "model": {}})  # before the card named its state group


def test_a_gated_deltanet_engine_calls_its_state_group_linear() -> None:
    assert state_kind(QWEN) == "linear"
    assert group_label(QWEN, "mamba") == "linear (mamba)"
    assert group_label(QWEN, "attention") == "attention"


def test_mamba_engines_and_engines_without_a_card_keep_the_stored_name() -> None:
    for engine in (BAMBA, OLD, None):
        assert state_kind(engine) == "mamba"
        assert group_label(engine, "mamba") == "mamba"
