"""Every checkpoint architecture Junction serves, in one table.

A new architecture is a builder module beside `ibm.py` (the builder and its `StateFields`)
and one entry in `ARCHITECTURES`, keyed by `config.json`'s `architectures[0]`; its tests add a
tiny checkpoint to tests/engine/model/hf_checkpoints.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from engine.model.hf.builders import Built
from engine.model.hf.ibm import IBM_STATE, bamba, granite
from engine.model.hf.nemotron_h import NEMOTRON_H_STATE, nemotron_h
from engine.model.hf.qwen import QWEN_STATE, qwen
from engine.model.hf.spec import HFModelSpec
from engine.model.hf.state_shapes import StateFields


class Architecture(NamedTuple):
    """How Junction reads and builds one architecture."""

    build: Callable[[HFModelSpec], Built]  # the Junction stack and the name map of its weights
    state: StateFields  # where config.json keeps the state layers' shape
    # each layer's feed-forward: "mlp"; "mlp_or_moe" (MoE when the config has experts); None
    # when feed-forwards are layers of their own
    ffn: str | None
    # image-text-to-text as published: Junction serves its language model (the config's
    # text_config, weights under model.language_model), text only
    multimodal: bool = False


ARCHITECTURES: dict[str, Architecture] = {
    "BambaForCausalLM": Architecture(bamba, IBM_STATE, "mlp"),
    "GraniteMoeHybridForCausalLM": Architecture(granite, IBM_STATE, "mlp_or_moe"),
    "NemotronHForCausalLM": Architecture(nemotron_h, NEMOTRON_H_STATE, None),
    "Qwen3_5ForCausalLM": Architecture(qwen, QWEN_STATE, "mlp_or_moe"),
    "Qwen3_5MoeForCausalLM": Architecture(qwen, QWEN_STATE, "mlp_or_moe"),
    "Qwen3NextForCausalLM": Architecture(qwen, QWEN_STATE, "mlp_or_moe"),
    "Qwen3_5ForConditionalGeneration": Architecture(qwen, QWEN_STATE, "mlp_or_moe", True),
    "Qwen3_5MoeForConditionalGeneration": Architecture(qwen, QWEN_STATE, "mlp_or_moe", True),
}

#: the names config.json may give, in the order errors list them
SUPPORTED = tuple(ARCHITECTURES)
