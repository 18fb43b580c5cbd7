"""`junction up --model DIR` names its engine from the model, so a new model's requests, hit
rate and pins never merge with the history of `engine-0` (or another model's) in the store."""

from __future__ import annotations

import re

import pytest

from engine.wire import ENGINE_ID_REGEX
from stack.engine_ids import engine_ids, model_slug
from stack.parts import Ports, plan


def engine_id_options(**fields) -> list[str]:
    """The `--engine-id` of every engine part `plan` makes."""
    parts = plan("127.0.0.1", Ports(8080, 8000, 8501), runner="ledger", **fields)
    argvs = [part.argv for part in parts if part.name.startswith("engine")]
    return [argv[argv.index("--engine-id") + 1] for argv in argvs]


def test_without_a_model_the_engines_stay_engine_0_and_on():
    assert engine_id_options() == ["engine-0"]
    assert engine_id_options(num_engines=3) == ["engine-0", "engine-1", "engine-2"]


def test_a_model_names_its_engines():
    assert engine_id_options(model="/ckpts/bamba-tiny") == ["bamba-tiny"]
    assert engine_id_options(model="/ckpts/Bamba-9B/", num_engines=2) == [
        "bamba-9b-0",
        "bamba-9b-1",
    ]


def test_an_engine_id_given_wins_over_the_model():
    assert engine_id_options(model="/ckpts/bamba-tiny", engine_id="mine") == ["mine"]


@pytest.mark.parametrize(
    ("model", "slug"),
    [
        ("/ckpts/Bamba-9B-v2", "bamba-9b-v2"),
        ("ibm-ai-platform/Bamba-9B", "bamba-9b"),  # a hub id in the local cache
        ("/hf/hub/models--Qwen--Qwen3-Next-80B/snapshots/0123abcd", "qwen3-next-80b"),
        ("/ckpts/My Model (fp8)", "my-model-fp8"),
        ("/ckpts/" + "x" * 300, "x" * 100),
        ("/ckpts/(((", "engine"),
    ],
)
def test_the_slug_keeps_to_the_wire_engine_id_rules(model: str, slug: str):
    assert model_slug(model) == slug
    for made in engine_ids(1, model) + engine_ids(16, model):
        assert re.match(ENGINE_ID_REGEX, made) and len(made) <= 128


def test_an_engine_id_off_the_wire_rules_is_refused_by_name():
    with pytest.raises(ValueError, match="'a b': 1 to 128 of A-Za-z0-9._:@-"):
        engine_ids(1, None, "a b")
