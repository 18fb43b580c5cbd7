"""Bad requests get OpenAI-style error bodies, which the OpenAI client raises with the message."""

from __future__ import annotations

import openai
import pytest

from tests.serve.conftest import MAX_MODEL_LEN, MODEL


@pytest.mark.parametrize(
    ("kwargs", "message", "param"),
    [
        ({"prompt": ""}, "prompt is empty", "prompt"),
        ({"prompt": []}, "prompt is empty", "prompt"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens must be at least 1", "max_tokens"),
        ({"prompt": "x" * (MAX_MODEL_LEN + 1)}, "max_model_len", None),
        ({"prompt": [1, 2, 300]}, "token ids must lie in [0, 258)", "prompt"),
        ({"prompt": ["a", "b"]}, "batched prompts are not supported", "prompt"),
        ({"prompt": "hi", "temperature": -1}, "temperature must be >= 0", "temperature"),
        ({"prompt": "hi", "top_p": 0}, "top_p must lie in (0, 1]", "top_p"),
        ({"prompt": "hi", "n": 2}, "n must be 1", "n"),
    ],
)
def test_a_bad_completion_is_a_400_with_the_message(client, kwargs, message, param):
    kwargs = {"model": MODEL, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**kwargs)
    assert info.value.status_code == 400
    assert message in info.value.message
    assert info.value.body["type"] == "invalid_request_error"
    assert info.value.param == param


def test_a_model_not_served_is_a_404_model_not_found(client):
    """As OpenAI answers it (docs/api.md): the client raises `NotFoundError`."""
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="hi")
    assert info.value.status_code == 404
    assert "'gpt-4' is not served here" in info.value.message
    assert info.value.body["code"] == "model_not_found"
    assert info.value.param == "model"
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])


def test_a_refused_stream_fails_before_it_starts(client):
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.completions.create(model=MODEL, prompt="x" * (MAX_MODEL_LEN + 1), stream=True)


def test_bad_chat_requests(client):
    with pytest.raises(openai.BadRequestError, match="messages must not be empty"):
        client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.BadRequestError, match="only text content parts"):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
        )


def test_a_validation_error_keeps_422_in_the_openai_shape(client, live_server):
    with pytest.raises(openai.UnprocessableEntityError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="hi", extra_body={"max_tokens": "many"})
    with live_server.http() as http:
        response = http.post("/v1/completions", json={"model": MODEL, "prompt": {"a": 1}})
        missing = http.post("/v1/chat/completions", json={"model": MODEL})
        not_json = http.post("/v1/completions", content=b"{", headers={"content-type": "x/json"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["param"] == "prompt" and error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt: expected one of str, list[int]")
    assert "got dict" in error["message"]
    assert missing.status_code == 422
    assert missing.json()["error"]["message"] == "messages: Field required"
    assert not_json.status_code == 422 and "error" in not_json.json()


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"model": "m", "prompt": "hi",}', "line 1, column 31"),
        (b'{\n  "model": "m",\n  "prompt": hi\n}', "line 3, column 13"),
    ],
)
def test_a_body_that_is_not_json_is_a_400_saying_so(live_server, body: bytes, where: str):
    with live_server.http() as http:
        response = http.post(
            "/v1/completions", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] is None and error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_json"
    assert error["message"].startswith(f"the request body is not valid JSON ({where}): ")


def test_unknown_paths_and_models_are_404s(client, live_server):
    with live_server.http() as http:
        response = http.get("/v1/nowhere")
    assert response.status_code == 404 and response.json()["error"]["message"] == "Not Found"
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("gpt-4")
