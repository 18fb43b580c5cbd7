"""Issue 47, item 19: a REST input error says each problem in one line, naming the field as the
client wrote it and what to do (`message`), as the engine's OpenAI port answers the same
mistake; pydantic's list stays beside it as `detail`, for programs. Against the real app over
SQLite and PostgreSQL (`client`), and through `client.rest` as the CLI and dashboard read it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from client.rest import error_detail

PINS = "/api/v1/pins"
JSON = {"content-type": "application/json"}


def refused(client: TestClient, body: bytes) -> dict:
    response = client.post(PINS, content=body, headers=JSON)
    assert response.status_code == 422, response.text
    answer = response.json()
    assert isinstance(answer["detail"], list)  # still there, for programs
    assert error_detail(response) == answer["message"].replace("\n", "; ")
    return answer


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (
            b'{"prefix": {"token_ids": [1, 2, "x"]}, "label": "a"}',
            "prefix.token_ids[2]: must be a valid integer, unable to parse string as an "
            "integer, got 'x': send a whole number",
        ),
        (
            b'{"prefix": {"text": "hi"}, "label": "a", "labl": "support"}',
            "labl: not a field of this request: remove it, or check its spelling",
        ),
        (
            b'{"prefix": {"text": "hi"}, "label": "a", "priority": "high"}',
            "priority: must be a valid integer, unable to parse string as an integer, "
            "got 'high': send a whole number",
        ),
        (b'{"label": "a"}', "prefix: required: add it"),
    ],
    ids=("list item", "misspelled field", "wrong type", "missing"),
)
def test_a_bad_body_is_one_line_naming_the_field_and_what_to_do(
    client: TestClient, body: bytes, line: str
) -> None:
    message = refused(client, body)["message"]
    assert message.startswith(line), message
    assert "\n" not in message  # one problem, one line
    assert "'loc'" not in message and "body." not in message


def test_broken_json_says_the_line_and_column_not_a_character_offset(client: TestClient) -> None:
    answer = refused(client, b'{"prefix":\n  {"text": "hi",}}')
    assert answer["message"] == (
        "the request body is not valid JSON (line 2, column 17): "
        "Expecting property name enclosed in double quotes"
    )


def test_each_problem_is_a_line_of_its_own(client: TestClient) -> None:
    message = refused(
        client, b'{"prefix": {"text": "hi"}, "label": "a", "priority": "high", "labl": 1}'
    )["message"]
    lines = message.split("\n")
    assert len(lines) == 2, message
    assert lines[0].startswith("priority: ") and lines[1].startswith("labl: ")


def test_a_bad_query_parameter_is_named_as_one(client: TestClient) -> None:
    response = client.get("/api/v1/junctions/suggested", params={"limit": "ten"})
    assert response.status_code == 422
    assert response.json()["message"].startswith(
        "query parameter limit: must be a valid integer"
    ), response.json()
