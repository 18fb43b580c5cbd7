"""Bad settings as one line each, naming the `JUNCTION_*` variable, the value it had (short)
and what it accepts, instead of pydantic's traceback that names fields.

It sits beside the lowest settings (`client.settings`), so every package's command can use
it. `cli.main` says them for every command whose settings (`api.settings.Settings`, or the
clients' `client.settings.ControlPlaneSettings` and `DashboardSettings`) refuse the
environment, and exits 2; `junction up` gathers them for every part before it starts anything.
"""

from __future__ import annotations

import sys

from pydantic import ValidationError

#: The settings classes whose refusals are said this way (pydantic's error title).
SETTINGS_TITLES = frozenset({"Settings", "ControlPlaneSettings", "DashboardSettings"})
#: The longest value quoted back: a setting may be a long URL or a whole file.
MAX_VALUE_CHARS = 40
PREFIX = "JUNCTION_"
#: The exit status of a command whose settings are bad (as for other bad input).
EXIT_BAD_SETTINGS = 2


def is_settings_error(exc: ValidationError) -> bool:
    return exc.title in SETTINGS_TITLES


def short(value: object) -> str:
    """The bad value as it was given, quoted and cut to `MAX_VALUE_CHARS`."""
    text = repr(value if isinstance(value, str) else str(value))
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 4] + "...'"


def _accepted(message: str) -> str:
    """pydantic's message as what the setting accepts."""
    for lead in ("Value error, ", "Input "):
        message = message.removeprefix(lead)
    return message


def describe(exc: ValidationError) -> list[str]:
    """One line a bad setting: `JUNCTION_NAME='value': what it accepts`."""
    problems: list[str] = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error.get("loc") else "?"
        line = f"{PREFIX}{field.upper()}={short(error.get('input'))}: {_accepted(error['msg'])}"
        if line not in problems:
            problems.append(line)
    return problems


def bad_fields(exc: ValidationError) -> set[str]:
    """The names of the fields `exc` refused."""
    return {str(error["loc"][0]) for error in exc.errors() if error.get("loc")}


def say(command: str, problems: list[str]) -> None:
    """Print the problems to stderr, one line each, under the command's name."""
    name = f"junction {command}" if command else "junction"
    lines = [f"{name}: {problem}" for problem in problems]
    print("\n".join(lines), file=sys.stderr, flush=True)
