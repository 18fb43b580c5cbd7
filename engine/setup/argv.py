"""What a command line did not take, said in one line: each unknown option with the known
options closest to it, so `--blok-size` answers "did you mean --block-size?". Shared by
`junction`'s own parser (`cli.main`) and `junction up`'s check of the options it passes to
`junction serve` (`stack.preflight`)."""

from __future__ import annotations

import argparse
import difflib


def unknown_options(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """What `parser` did not take, each unknown option with its closest known ones: `unknown
    option --blok-size (did you mean --block-size?)`."""
    known = [option for action in parser._actions for option in action.option_strings]
    problems = []
    for extra in extras:
        if not extra.startswith("-") or extra == "-":
            continue  # an unknown option's value, most likely
        name = extra.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        guess = f" (did you mean {' or '.join(close)}?)" if close else ""
        problems.append(f"unknown option {name}{guess}")
    return "; ".join(problems) or f"unrecognized arguments: {' '.join(extras)}"
