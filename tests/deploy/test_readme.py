"""The README's first screen says, in plain words, what Junction does for someone who serves a
hybrid model, then gives the two commands: a newcomer reads it before anything else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_SCREEN = 30  # lines a terminal or a repository page shows before scrolling
#: words a newcomer cannot know yet: the rules' terms (docs/rules.md), as they are spelt there
#: (the product's name, Junction, is capitalized)
JARGON = ("match unit", "junction", "checkpoint", "oracle", "Mamba block", "Ba ", "Bm ", "U ")


def readme_lines() -> list[str]:
    return (ROOT / "README.md").read_text().splitlines()


def opening() -> str:
    """The text between the title and the first section."""
    lines = readme_lines()
    first_section = next(i for i, line in enumerate(lines) if line.startswith("## "))
    return "\n".join(lines[1:first_section])


def test_the_opening_names_the_models_it_serves_in_plain_words():
    text = opening()
    assert "Qwen3.5" in text and "Nemotron-H" in text
    used = [word for word in JARGON if re.search(rf"\b{re.escape(word)}", text)]
    assert not used, f"the README's opening uses terms a newcomer does not know yet: {used}"
    assert len(text.split()) <= 120, "the opening is a paragraph, not a page"


def test_the_two_commands_are_on_the_first_screen():
    first = readme_lines()[:FIRST_SCREEN]
    assert "## The two commands" in first
    commands = [line.split("#")[0].strip() for line in first if line.startswith("make ")]
    assert commands == ["make run", "make test"]
