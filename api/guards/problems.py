"""A 422's validation errors in words: one line per problem, naming the field as a client
writes it and what to do, as the engine's OpenAI port answers the same mistake.

Pydantic's list is for programs (`{"loc": ["body", "prefix", "segments", 0, "len"], "type":
"int_parsing", ...}`, a JSON error's place as a character offset); a person at a terminal or
on the dashboard reads `message` instead: `prefix.segments[0].len: must be an integer, got
'ten': send a whole number`. The list stays beside it as `detail`, for programs.
"""

from __future__ import annotations

from typing import Any

#: Pydantic's names for the member of a union it tried, which a client never wrote.
_UNION_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}
#: What to do, by pydantic's error type: said after what was wrong.
_WHAT_TO_DO = {
    "missing": "add it",
    "extra_forbidden": "remove it, or check its spelling against the API's schema (/docs)",
    "int_parsing": "send a whole number",
    "int_type": "send a whole number",
    "int_from_float": "send a whole number",
    "float_parsing": "send a number",
    "float_type": "send a number",
    "bool_parsing": "send true or false",
    "bool_type": "send true or false",
    "string_type": "send a string",
    "list_type": "send a JSON list",
    "dict_type": "send a JSON object",
    "model_type": "send a JSON object",
    "literal_error": "send one of the values named",
    "enum": "send one of the values named",
    "greater_than": "send a larger value",
    "greater_than_equal": "send a larger value",
    "less_than": "send a smaller value",
    "less_than_equal": "send a smaller value",
    "too_short": "send more items",
    "too_long": "send fewer items",
    "string_too_short": "send a longer string",
    "string_too_long": "send a shorter string",
    "string_nul": "leave out the NUL character (\\u0000)",
    "string_unstorable": "leave out NUL characters and lone surrogates",
}
_KINDS = {"body": "", "query": "query parameter ", "path": "path parameter ", "header": "header "}


def where(loc: Any) -> str:
    """The field as a client writes it: `prefix.segments[0].len`, `query parameter since`; ""
    for the body as a whole (a JSON error's character offset is not a field)."""
    parts = list(loc) if isinstance(loc, list | tuple) else []
    kind = _KINDS.get(str(parts[0]), "") if parts else ""
    if parts and str(parts[0]) in _KINDS:
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (isinstance(part, str) and ("[" in part or part in _UNION_TAGS)):
            out += f".{part}" if out else str(part)
    return f"{kind}{out}" if out else ""


def problem_line(error: dict[str, Any]) -> str:
    """One validation error (as `api.guards.errors.brief_error` keeps it) as one line."""
    kind = str(error.get("type", ""))
    loc = [] if kind == "json_invalid" else error.get("loc", [])
    field = where(loc)
    what = str(error.get("msg", "invalid")).replace("\n", " ")
    if kind == "missing":
        what = "required"
    elif kind == "extra_forbidden":
        what = "not a field of this request"
    elif what.startswith("Input should be "):
        what = "must be " + what.removeprefix("Input should be ")
    elif kind == "value_error":  # the model's own sentence, which says what it was given
        what = what.removeprefix("Value error, ")
    if "input" in error and kind not in (
        "missing",
        "json_invalid",
        "extra_forbidden",
        "value_error",
    ):
        what += f", got {_shown(error['input'])}"
    todo = _WHAT_TO_DO.get(kind)
    line = f"{field}: {what}" if field else what
    return f"{line}: {todo}" if todo else line


def problems_message(errors: list[dict[str, Any]]) -> str:
    """The lines of `errors`, one a problem, those of a union's members under one field
    said once (`x: must be a valid integer, got 'a'; must be a valid string ...`)."""
    by_field: dict[str, list[str]] = {}
    for error in errors:
        by_field.setdefault(where(error.get("loc", [])), []).append(problem_line(error))
    lines = []
    for field, found in by_field.items():
        if len(found) == 1:
            lines.append(found[0])
        else:
            rest = [line.removeprefix(f"{field}: ") if field else line for line in found[1:]]
            lines.append("; or ".join([found[0], *rest]))
    return "\n".join(lines) or "invalid request"


def _shown(value: Any) -> str:
    """The input as `brief_error` kept it: already short (its preview, about `PREVIEW_CHARS`
    characters, for a long one)."""
    return repr(value) if not isinstance(value, dict | list) else str(value)
