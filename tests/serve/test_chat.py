"""`/v1/chat/completions` through the official OpenAI client."""

from __future__ import annotations

from engine.model.tokenizer import render_chat
from tests.serve.conftest import MODEL, text_prompt

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Say something about caches."},
]


def test_a_chat_completion_renders_the_template(client):
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0
    )
    assert completion.object == "chat.completion"
    (choice,) = completion.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    assert completion.usage.prompt_tokens == len(render_chat(MESSAGES).encode())
    assert completion.usage.completion_tokens == 6


def test_streamed_chat_equals_the_whole_chat(client):
    whole = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=30, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_completion_tokens=30,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 30


def test_a_shared_system_prompt_is_cached(client):
    system = {"role": "system", "content": text_prompt(201)}
    first = client.chat.completions.create(
        model=MODEL, messages=[system, {"role": "user", "content": "one"}], max_tokens=1
    )
    second = client.chat.completions.create(
        model=MODEL, messages=[system, {"role": "user", "content": "two"}], max_tokens=1
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= 512


def test_text_content_parts_are_joined(client):
    parts = [{"type": "text", "text": "Say something "}, {"type": "text", "text": "about caches."}]
    as_parts = client.chat.completions.create(
        model=MODEL, messages=[MESSAGES[0], {"role": "user", "content": parts}], temperature=0
    )
    as_text = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0)
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
