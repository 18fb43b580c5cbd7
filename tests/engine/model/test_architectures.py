"""The architecture registry: one table says how each checkpoint architecture is read and built."""

from __future__ import annotations

import pytest

from engine.model.hf import ARCHITECTURES, SUPPORTED, load_hf_model, load_spec
from engine.model.hf.architectures import Architecture
from engine.model.hf.state_shapes import GDNStateShape, MambaStateShape
from tests.engine.model.hf_checkpoints import CheckpointCache

pytestmark = pytest.mark.usefixtures("one_thread")


def test_supported_is_the_registry_in_order() -> None:
    assert SUPPORTED == tuple(ARCHITECTURES)
    assert SUPPORTED[0] == "BambaForCausalLM"


@pytest.mark.parametrize("name", SUPPORTED)
def test_every_entry_is_complete_and_consistent(name: str) -> None:
    entry = ARCHITECTURES[name]
    assert callable(entry.build)
    assert entry.ffn in ("mlp", "mlp_or_moe", None)
    kind, shape = entry.state.kind, entry.state.shape
    assert (kind, shape) in (("mamba", MambaStateShape), ("linear", GDNStateShape))
    assert len(entry.state.fields) == 5
    assert set(entry.state.divides) <= set(entry.state.fields)
    assert entry.multimodal == name.endswith("ForConditionalGeneration")


@pytest.mark.parametrize(("variant", "kind"), [("bamba", "mamba"), ("qwen3_5", "linear")])
def test_the_spec_names_state_layers_by_the_entrys_kind(
    checkpoints: CheckpointCache, variant: str, kind: str
) -> None:
    spec = load_spec(checkpoints.get(variant))
    assert kind in spec.layer_kinds
    assert spec.state_kind == kind
    assert spec.ffn_kind == "mlp"


def test_loading_builds_through_the_registry_entry(
    checkpoints: CheckpointCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = []

    def build(spec):
        built.append(spec.architecture)
        raise RuntimeError("built through the registry")

    entry = ARCHITECTURES["BambaForCausalLM"]
    monkeypatch.setitem(ARCHITECTURES, "BambaForCausalLM", Architecture(build, *entry[1:]))
    with pytest.raises(RuntimeError, match="built through the registry"):
        load_hf_model(checkpoints.get("bamba"))
    assert built == ["BambaForCausalLM"]
