"""Message checkpoints through the OpenAI server (chat's rendered messages, the completions
extension field `checkpoint_offsets`) and pins of chat messages as control-plane commands."""

from __future__ import annotations

import openai
import pytest

from engine.model.tokenizer import ByteTokenizer, message_ends, render_messages
from engine.wire import Command
from publish.commands import apply_command
from tests.publish.test_commands import make, pin_states
from tests.serve.conftest import MODEL, text_prompt

UNIT = 16  # the live server's match unit; its Mamba blocks are 64 tokens


def test_a_completion_keeps_the_state_at_its_checkpoint_offsets(client):
    shared = text_prompt(301, 300)
    first = client.completions.create(
        model=MODEL,
        prompt=shared + text_prompt(302, 100),
        max_tokens=1,
        extra_body={"checkpoint_offsets": [300]},
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = client.completions.create(model=MODEL, prompt=shared + "!" + text_prompt(303, 99))
    # 288 is the message checkpoint; without it the hit would stop at the block floor, 256
    assert second.usage.prompt_tokens_details.cached_tokens == 288


@pytest.mark.parametrize("offsets", [[0], [401], [5, 1000]])
def test_checkpoint_offsets_outside_the_prompt_are_a_400_naming_the_param(client, offsets):
    with pytest.raises(openai.BadRequestError, match=r"must lie in \(0, 400\]") as info:
        client.completions.create(
            model=MODEL, prompt=text_prompt(304, 400), extra_body={"checkpoint_offsets": offsets}
        )
    assert info.value.param == "checkpoint_offsets"


def test_a_fleet_offset_keeps_the_state_there_as_a_checkpoint_offset_does(client):
    """`junction.checkpoint_offsets`: where `junction route` saw the prompt part from what
    other engines hold (`router.caches.branches`); chat takes it as completions do."""
    shared = text_prompt(311, 300)
    question = {"role": "user", "content": shared + text_prompt(312, 100)}
    before = render_messages([question]).split(shared)[0]
    offset = len(before.encode()) + len(shared.encode())  # the shared text's end, in bytes
    first = client.chat.completions.create(
        model=MODEL,
        messages=[question],
        max_tokens=1,
        extra_body={"junction": {"checkpoint_offsets": [offset]}},
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = {"role": "user", "content": shared + "!" + text_prompt(313, 99)}
    second = client.chat.completions.create(model=MODEL, messages=[again], max_tokens=1)
    assert second.usage.prompt_tokens_details.cached_tokens == offset // UNIT * UNIT


def test_a_fleet_offset_outside_the_prompt_is_a_400_naming_the_field(client):
    with pytest.raises(openai.BadRequestError, match=r"must lie in \(0, 400\]") as info:
        client.completions.create(
            model=MODEL,
            prompt=text_prompt(314, 400),
            extra_body={"junction": {"checkpoint_offsets": [401]}},
        )
    assert info.value.param == "junction.checkpoint_offsets"


def test_a_chat_familys_second_request_hits_the_whole_system_message(client):
    system = {"role": "system", "content": text_prompt(305, 250)}
    first = client.chat.completions.create(
        model=MODEL, messages=[system, {"role": "user", "content": "first"}], max_tokens=1
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = client.chat.completions.create(
        model=MODEL, messages=[system, {"role": "user", "content": "second"}], max_tokens=1
    )
    system_end = message_ends([system])[0]
    assert system_end % 64 and second.usage.prompt_tokens_details.cached_tokens == (
        system_end // UNIT * UNIT
    )


def test_a_pin_command_of_messages_is_rendered_by_the_engine():
    engine = make()
    messages = [{"role": "system", "content": text_prompt(306, 200)}]
    payload = {"pin_id": "chat", "messages": messages, "token_ids": [], "cache_salt": None}
    apply_command(engine, Command(command="pin", payload=payload))
    engine.run_until_done()
    rendered = ByteTokenizer().encode(render_messages(messages))
    pin = engine.pins["chat"]
    assert pin.boundary == len(rendered) // UNIT * UNIT and pin_states(engine, "chat")[-1] == (
        "materialized"
    )


def test_a_pin_command_with_bad_messages_is_reported_failed():
    engine = make()
    payload = {"pin_id": "bad", "messages": [{"role": "system"}]}
    apply_command(engine, Command(command="pin", payload=payload))
    assert pin_states(engine, "bad") == ["failed"]
