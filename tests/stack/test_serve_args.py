"""`junction up -- SERVE OPTIONS`: engine options pass through to the engine's `junction serve`,
checked by its own parser before anything starts."""

from __future__ import annotations

import pytest

from stack.parts import Ports, plan
from stack.preflight import check_serve_args


def engine_argv(serve_args: tuple[str, ...]) -> list[str]:
    parts = plan("127.0.0.1", Ports(8080, 8000, 8501), runner="ledger", serve_args=serve_args)
    (engine,) = [part for part in parts if part.name == "engine"]
    return engine.argv


def test_options_after_the_separator_reach_the_engine_last():
    serve_args = check_serve_args(["--", "--block-size", "64", "--no-junction-checkpoints"])
    assert serve_args == ("--block-size", "64", "--no-junction-checkpoints")
    argv = engine_argv(serve_args)
    assert argv[argv.index("serve") :][-3:] == list(serve_args)
    assert "--runner" in argv  # up's own options stay; a repeated option given after wins


def test_no_engine_options_change_nothing():
    assert check_serve_args([]) == () == check_serve_args(["--"])
    assert engine_argv(()) == engine_argv(check_serve_args(["--"]))


@pytest.mark.parametrize(
    ("serve_args", "message"),
    [
        (["--", "--bogus"], "unknown option --bogus"),
        (["--", "--blok-size", "64"], r"unknown option --blok-size \(did you mean --block-size"),
        (["--", "--checkpoint-mode", "sometimes"], "invalid choice: 'sometimes'"),
        (["--", "--block-size", "48", "--prefix-match-unit", "32"], "must divide"),
    ],
)
def test_bad_engine_options_are_refused_by_name(serve_args, message):
    with pytest.raises(ValueError, match=message) as error:
        check_serve_args(serve_args)
    assert "engine options" in str(error.value)
