"""`TextStream`: deltas never split a UTF-8 character or a stop string, and join to the text."""

from __future__ import annotations

import random

import pytest

from engine.model.tokenizer import BOS_ID, EOS_ID
from serve.text_stream import TextStream


def deltas(stream: TextStream, token_ids: list[int]) -> list[str]:
    out = [stream.push([t]) for t in token_ids]
    return [*out, stream.finish()]


def test_a_multibyte_character_waits_for_its_last_byte():
    stream = TextStream()
    encoded = list("é€".encode())  # 2 bytes, then 3
    assert deltas(stream, encoded) == ["", "é", "", "", "€", ""]
    assert stream.text == "é€"


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_join_to_one_decode(seed):
    rng = random.Random(seed)
    token_ids = [rng.choice([rng.randrange(256), 0xE2, 0x82, 0xAC, 0xC3]) for _ in range(300)]
    stream = TextStream()
    joined = "".join(deltas(stream, token_ids))
    assert joined == stream.text == bytes(token_ids).decode("utf-8", errors="replace")


def test_special_ids_are_dropped():
    stream = TextStream()
    assert "".join(deltas(stream, [BOS_ID, *b"ok", EOS_ID])) == "ok"


def test_a_stop_string_is_held_back_then_cut():
    stream = TextStream(stop=["END"])
    out = deltas(stream, list(b"abcENxEND tail"))
    assert "".join(out) == stream.text == "abcENx"
    assert stream.is_stopped
    # "E" and "EN" were held back until "x" showed they were not the stop string
    assert out[:6] == ["a", "b", "c", "", "", "ENx"]


def test_a_held_back_prefix_is_released_when_the_output_ends():
    stream = TextStream(stop=["END"])
    assert "".join(deltas(stream, list(b"abEN"))) == "abEN"
    assert not stream.is_stopped


def test_the_earliest_of_several_stop_strings_wins():
    stream = TextStream(stop=["zz", "b c"])
    stream.push(list(b"a b czz"))
    assert stream.text == "a "
    assert stream.push(list(b"more")) == ""
