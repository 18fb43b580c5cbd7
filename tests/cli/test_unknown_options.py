"""An option a `junction` subcommand does not know is said by that subcommand in one line,
with the closest options it does know, exit 2 (not the top-level usage)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from cli.main import build_parser, main


def test_serve_with_a_misspelled_option_says_the_one_it_meant() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", "--blok-size", "64"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("junction serve: unknown option --blok-size (did you mean --block-size")
    assert "usage: junction [-h]" not in done.stderr


def long_options(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]


def subcommand(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    """The parser of `junction NAME...` (`attach vllm`: two levels)."""
    for name in names:
        (found,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = found.choices[name]
    return parser


def commands() -> list[str]:
    (subcommands,) = (
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    return list(subcommands.choices)


def misspelled(option: str) -> str:
    """`option` with two letters of its name swapped: `--block-size` -> `--blcok-size`."""
    i = 4 if len(option) > 5 else 2
    return option[:i] + option[i + 1] + option[i] + option[i + 2 :]


#: What each command requires before it takes an option (its positionals, its required options).
GIVEN = {
    "replay": ["trace.jsonl"],
    "whatif": ["--trace", "trace.jsonl"],
    "attach": ["--events", "tcp://127.0.0.1:5557"],
    "pin": ["--text", "You are terse.", "--label", "terse"],
    "unpin": ["pin-id"],
}
#: The commands whose own subcommands take the options (`junction attach vllm`).
NESTED = {"attach": ["vllm"]}


@pytest.mark.parametrize("command", commands())
def test_every_command_names_itself_and_the_option_meant(command: str, capsys) -> None:
    given = GIVEN.get(command, [])  # what it requires, so that only the option is wrong
    names = [command, *NESTED.get(command, [])]
    parser = subcommand(build_parser(), *names)
    options = [o for o in long_options(parser) if o != "--help"] or ["--port"]
    option = max(options, key=len)  # a long name: its misspelling is no prefix of another
    wrong = misspelled(option)
    with pytest.raises(SystemExit) as info:
        main([*names, *given, wrong])
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{parser.prog}: unknown option {wrong}"), line
    assert option in line or len(options) == 1, line  # migrate takes no option at all


def test_a_stray_value_is_said_as_unrecognized(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["migrate", "now"])
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith("junction migrate: unrecognized arguments: now")
