"""Qwen3.5 as it is published, `Qwen3_5ForConditionalGeneration`: Junction serves its language
model (text only) and leaves the vision tower's tensors unread; the logits equal transformers'
forward of the whole multimodal model on a text prompt, at every position, and the greedy
continuation equals `generate`."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText

from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.engine import Engine
from engine.model.hf import load_hf_model
from engine.model.hf.config import load_spec
from engine.request import SamplingParams
from engine.runners.torch_runner import TorchRunner
from tests.engine.model.conftest import PagedKV, prefill_chunks
from tests.engine.model.hf_checkpoints import build_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "qwen3_5-multimodal"
    return build_checkpoint("Qwen3_5ForConditionalGeneration", path)


def test_the_spec_reads_the_language_model(model_dir) -> None:
    spec = load_spec(model_dir)
    assert spec.architecture == "Qwen3_5ForConditionalGeneration"
    assert spec.state_kind == "linear" and spec.num_mamba_layers == 3
    assert spec.weights_prefix == "model.language_model"
    assert spec.hidden_size == spec.hf_config.hidden_size == 32


def test_text_logits_and_greedy_tokens_equal_transformers(model_dir) -> None:
    reference = AutoModelForImageTextToText.from_pretrained(model_dir, local_files_only=True)
    reference.eval()
    model = load_hf_model(model_dir, "float32", "cpu")
    tokens = torch.randint(16, 384, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = reference(input_ids=tokens[None]).logits[0].float()  # [l, V]
    torch.testing.assert_close(model.forward_reference(tokens), want, atol=1e-4, rtol=0)
    out = prefill_chunks(model, PagedKV(model, 8), list(range(8)), tokens, [17, 40])
    torch.testing.assert_close(out.logits, want[-1], atol=1e-4, rtol=0)

    cache = CacheConfig(block_size=8, mamba_block_size=32, num_blocks=64, num_mamba_blocks=16)
    config = ModelConfig(model_dir=str(model_dir), device="cpu")
    engine = Engine(cache, SchedulerConfig(), config, runner=TorchRunner(cache, config))
    (request,) = engine.generate([tokens.tolist()], SamplingParams(max_tokens=16))
    with torch.no_grad():
        generated = reference.generate(
            input_ids=tokens[None], max_new_tokens=16, do_sample=False, eos_token_id=None
        )
    assert request.output_token_ids == generated[0, len(tokens) :].tolist()
