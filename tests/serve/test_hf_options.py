"""`--model` and `--kv-cache-memory`: a checkpoint directory or a hub id in the local cache
(nothing downloaded), pools sized from the bytes the config implies, and every bad value one
line naming its option, exit 2, before anything is served."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from bench.spec import BenchmarkSpec
from cli.main import main
from engine.engine import Engine
from engine.setup.cache_memory import MemoryBudget, parse_budget
from engine.setup.model_card import describe, model_card
from engine.setup.model_dir import resolve_model_dir
from engine.setup.options import EXIT_BAD_INPUT, configs_from_args
from serve.cli import add_serve_parser
from tests.engine.model.hf_checkpoints import VARIANTS, build_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return build_checkpoint("BambaForCausalLM", tmp_path_factory.mktemp("bamba"))


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="junction")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", "--device", "cpu", *argv])


def refusal(capsys, *argv: str) -> str:
    """`junction serve ARGV` must exit 2 with one line on stderr; returns it."""
    assert main(["serve", "--device", "cpu", *argv]) == EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def config_bytes(checkpoint: Path) -> tuple[int, int]:
    """(bytes of a token's keys and values, bytes of a Mamba slot) in float32, from config.json
    by hand: keys and values [kv, dh] per attention layer; conv [m, k - 1] and ssm [h, p, n]
    per Mamba layer."""
    c = json.loads((checkpoint / "config.json").read_text())
    num_attention = len(c["attn_layer_indices"])
    num_mamba = c["num_hidden_layers"] - num_attention
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    h, p, n, g = c["mamba_n_heads"], c["mamba_d_head"], c["mamba_d_state"], c["mamba_n_groups"]
    conv = (h * p + 2 * g * n) * (c["mamba_d_conv"] - 1)
    return 2 * num_attention * c["num_key_value_heads"] * head_dim * 4, num_mamba * (
        conv + h * p * n
    ) * 4


def test_a_hub_id_that_is_no_directory_is_refused_saying_to_pass_one(capsys):
    line = refusal(capsys, "--model", "ibm-ai-platform/Bamba-9B")
    assert line.startswith("junction serve: --model ibm-ai-platform/Bamba-9B: no such directory")
    assert "pass the directory" in line


def test_a_hub_id_in_the_local_cache_is_used_offline(tmp_path):
    snapshot = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc123")
    assert resolve_model_dir("org/tiny", cache_dir=tmp_path) == str(snapshot)
    with pytest.raises(ValueError, match="--model org/other: no such directory"):
        resolve_model_dir("org/other", cache_dir=tmp_path)


def test_a_directory_without_config_json_is_refused(capsys, tmp_path):
    assert "no config.json in that directory" in refusal(capsys, "--model", str(tmp_path))


def test_weights_of_the_built_in_model_do_not_go_with_a_checkpoint(capsys, checkpoint):
    line = refusal(capsys, "--model", str(checkpoint), "--weights", "x.safetensors")
    assert "--weights is for the built-in model" in line


def test_the_served_name_is_the_directorys(checkpoint):
    _, _, model = configs_from_args(parse("--model", str(checkpoint)))
    assert (model.name, model.model_dir) == (checkpoint.name, str(checkpoint))
    _, _, named = configs_from_args(parse("--model", str(checkpoint), "--model-name", "x"))
    assert named.name == "x"


def test_the_longest_request_is_the_checkpoints_own(checkpoint, tmp_path):
    """config.json's `max_position_embeddings` bounds a request (and is what the hello and the
    model card report); without one, or with a longer one, the engine's default stays."""
    config = json.loads((checkpoint / "config.json").read_text())
    cases = [(262_144, 262_144), (1 << 22, 1 << 20), (None, 1 << 20)]
    for value, expected in cases:
        copy = tmp_path / f"ckpt-{value}"
        copy.mkdir()
        changed = {k: v for k, v in config.items() if k != "max_position_embeddings"}
        if value is not None:
            changed["max_position_embeddings"] = value
        (copy / "config.json").write_text(json.dumps(changed))
        _, scheduler, _ = configs_from_args(parse("--model", str(copy)))
        assert scheduler.max_model_len == expected, value
    multimodal = tmp_path / "multimodal"
    multimodal.mkdir()
    text_config = {k: v for k, v in config.items() if k != "max_position_embeddings"}
    wrapped = {"text_config": {**text_config, "max_position_embeddings": 32_768}}
    (multimodal / "config.json").write_text(json.dumps(wrapped))
    _, scheduler, _ = configs_from_args(parse("--model", str(multimodal)))
    assert scheduler.max_model_len == 32_768


@pytest.mark.parametrize(
    ("text", "budget"),
    [
        ("8GiB", MemoryBudget(8 * 2**30, None)),
        ("512MiB", MemoryBudget(512 * 2**20, None)),
        ("1.5GB", MemoryBudget(1_500_000_000, None)),
        ("1000000", MemoryBudget(1_000_000, None)),
        ("0.9", MemoryBudget(None, 0.9)),
        ("1", MemoryBudget(None, 1.0)),
    ],
)
def test_budgets_are_bytes_or_a_fraction(text, budget):
    assert parse_budget(text) == budget


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("lots", "give bytes"),
        ("8XB", "give bytes"),
        ("1e9", "give bytes"),
        ("0", "a fraction must lie in (0, 1]"),
        ("2.5", "a plain number above 1 is bytes"),
        ("1KiB", "raise --kv-cache-memory"),
    ],
)
def test_bad_budgets_are_refused_naming_the_option(capsys, checkpoint, value, reason):
    line = refusal(capsys, "--model", str(checkpoint), "--kv-cache-memory", value)
    assert line.startswith("junction serve: --kv-cache-memory") and reason in line


def test_a_budget_and_a_number_of_blocks_are_not_both_given(capsys):
    line = refusal(capsys, "--kv-cache-memory", "8MiB", "--num-blocks", "100")
    assert "give --kv-cache-memory or --num-blocks, not both" in line


def test_a_budget_buys_pools_that_cover_the_same_tokens(checkpoint):
    token_bytes, slot_bytes = config_bytes(checkpoint)
    budget = 8 * 2**20
    cache, _, model = configs_from_args(
        parse("--model", str(checkpoint), "--kv-cache-memory", "8MiB")
    )
    block_bytes = token_bytes * cache.attention_block_size
    used = cache.num_blocks * block_bytes + cache.num_mamba_blocks * slot_bytes
    assert budget - slot_bytes < used <= budget  # nothing a slot could use is left over
    covered_by_attention = cache.num_blocks * cache.attention_block_size
    covered_by_mamba = cache.num_mamba_blocks * cache.mamba_block_size
    assert abs(covered_by_attention - covered_by_mamba) <= cache.mamba_block_size
    geometry = model_card(model, cache)["geometry"]
    assert (geometry["attention_bytes_per_block"], geometry["mamba_bytes_per_slot"]) == (
        block_bytes,
        slot_bytes,
    )
    assert geometry["cache_bytes"] == used


def test_fixed_mamba_slots_leave_the_rest_to_attention(checkpoint):
    token_bytes, slot_bytes = config_bytes(checkpoint)
    argv = ("--model", str(checkpoint), "--kv-cache-memory", "4MiB", "--num-mamba-blocks", "100")
    cache, _, _ = configs_from_args(parse(*argv))
    block_bytes = token_bytes * cache.attention_block_size
    assert cache.num_mamba_blocks == 100
    assert cache.num_blocks == (4 * 2**20 - 100 * slot_bytes) // block_bytes


def test_a_fraction_is_of_the_free_memory(checkpoint):
    cache, _, model = configs_from_args(
        parse("--model", str(checkpoint), "--kv-cache-memory", "0.01")
    )
    total_ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < model_card(model, cache)["geometry"]["cache_bytes"] <= 0.01 * total_ram


@pytest.mark.parametrize("variant", [*VARIANTS, None], ids=[*VARIANTS, "built-in"])
def test_the_runner_allocates_the_bytes_the_card_says(checkpoints, variant):
    argv = ("--model", str(checkpoints.get(variant))) if variant else ()
    cache, scheduler, model = configs_from_args(parse(*argv, "--kv-cache-memory", "6MiB"))
    runner = Engine(cache, scheduler, model, runner="torch").runner
    tensors = [t for pair in runner.kv for t in pair] + runner.conv + runner.ssm
    allocated = sum(t.numel() * t.element_size() for t in tensors)
    card = model_card(model, cache)
    assert allocated == card["geometry"]["cache_bytes"] <= 6 * 2**20
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    assert math.isclose(card["weights_bytes"], weights, rel_tol=0.01)
    assert runner.dtype == torch.float32
    # the state group is named by what fills it: Gated DeltaNet states in Qwen
    assert card["state_group"] == ("linear" if variant and variant.startswith("qwen") else "mamba")
    assert ("Gated DeltaNet" in describe(card)) == (card["state_group"] == "linear")


def test_a_replay_runs_the_checkpoint_and_hits_the_shared_prefix(checkpoint, tmp_path, capsys):
    trace, out = tmp_path / "trace.jsonl", tmp_path / "records.jsonl"
    shared = {"seed": 1, "len": 300}
    lines = [
        {"id": "a", "prompt": {"segments": [shared, {"seed": 2, "len": 40}]}, "max_tokens": 2},
        {"id": "b", "prompt": {"segments": [shared, {"seed": 3, "len": 40}]}, "max_tokens": 2},
        {"id": "c", "prompt": {"segments": [shared, {"seed": 4, "len": 40}]}, "max_tokens": 2},
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["replay", str(trace), "--runner", "torch", "--model", str(checkpoint)]
    argv += ["--device", "cpu", "--mamba-block-size", "64", "--quiet", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # b hits the last Mamba block boundary (64 tokens) and keeps the junction at 300, floored
    # to the unit 16, which c hits
    assert [r["num_cached_tokens"] for r in records] == [0, 256, 288]


def test_a_benchmark_spec_takes_a_model_directory(checkpoint):
    workload = {"kind": "generated_shared_prefix", "seed": 0, "num_groups": 2}
    spec = BenchmarkSpec.model_validate(
        {"name": "hf", "workload": workload, "model": {"model_dir": str(checkpoint)}}
    )
    assert spec.model.to_model_config().model_dir == str(checkpoint)
    with pytest.raises(ValidationError, match="model.model_dir org/absent: no such directory"):
        BenchmarkSpec.model_validate(
            {"name": "hf", "workload": workload, "model": {"model_dir": "org/absent"}}
        )
