"""Operator commands from the control plane, applied to the engine on its own thread.

`pin {pin_id, token_ids, cache_salt}` materializes a pin (the engine floors the boundary to its
hit grid); a pin command that carries `messages` (`[{"role", "content"}, ...]`) pins them as
this engine's chat template renders them, up to the end of the last message (no assistant
header), and one that carries `text` pins it as this engine's tokenizer encodes a prompt;
their `token_ids` (the byte tokenizer's) are then ignored. A pin the engine already holds is
reported again rather than redone, since the control plane resends every active pin when an engine
reconnects. `unpin {pin_id}` releases one. A pin the engine cannot take is reported as failed
with the reason, never raised.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable

from engine.engine import Engine
from engine.model.tokenizer import ByteTokenizer, Tokenizer
from engine.pins import Pin, PinState
from engine.wire import Command

log = logging.getLogger(__name__)


def apply_command(engine: Engine, command: Command, tokenizer: Tokenizer | None = None) -> None:
    """Apply `command`; a pin's messages are rendered by `tokenizer` (default: the byte one)."""
    payload = command.payload
    pin_id = str(payload.get("pin_id", ""))
    if command.command == "unpin":
        if pin_id in engine.pins and engine.pins[pin_id].is_active:
            engine.unpin(pin_id)
        return
    current = engine.pins.get(pin_id)
    if current is not None and current.is_active:
        engine.sink.emit(current.event())  # already pinned here: say so again
        engine.notify_listeners()
        return
    token_ids = payload.get("token_ids")
    try:
        if payload.get("messages") is not None:
            token_ids = message_tokens(tokenizer or ByteTokenizer(), payload["messages"])
        elif isinstance(payload.get("text"), str):
            token_ids = (tokenizer or ByteTokenizer()).encode(payload["text"])
        if not pin_id or not isinstance(token_ids, list):
            raise ValueError("a pin command needs a pin_id and a list of token_ids")
        engine.pin(pin_id, [int(t) for t in token_ids], payload.get("cache_salt"))
    except (ValueError, TypeError) as exc:
        log.warning("pin %s refused: %s", pin_id, exc)
        failed = Pin(pin_id, len(token_ids or []), 0, None, PinState.FAILED, str(exc))
        engine.sink.emit(failed.event())
        engine.notify_listeners()


def message_tokens(tokenizer: Tokenizer, messages: object) -> list[int]:
    """Chat messages as this engine's template renders them, up to the last one's end."""
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise ValueError('a pin\'s messages must be a list of {"role", "content"} strings')
    return tokenizer.messages_prefix(messages)


class CommandQueue:
    """Commands received on the publisher's thread, applied on the engine's thread.

    `on_command` is the publisher's callback; `drain` runs as a step listener, and `wake`
    (if given) runs it on an idle engine loop so a command does not wait for the next request.
    A pin's messages are rendered by `tokenizer`, the engine's model's (default: the byte one).
    """

    def __init__(
        self,
        wake: Callable[[Callable[[Engine], None]], object] | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._tokenizer = tokenizer
        self._wake = wake

    def attach(self, engine: Engine) -> None:
        """Drain before other step listeners, so the publisher batches what a command did."""
        engine.step_listeners.insert(0, self.drain)

    def on_command(self, command: Command) -> None:
        # Queued first, then drained on the engine thread: commands apply in arrival order,
        # and one that comes before the loop runs (the publisher connects first, and an idle
        # engine takes no step) is applied when the loop starts (`AsyncEngine` notifies the
        # step listeners then).
        self._commands.put(command)
        if self._wake is not None:
            try:
                self._wake(self.drain)
            except Exception as exc:
                log.info("engine loop not running (%s); the command waits for it", exc)

    def drain(self, engine: Engine) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            apply_command(engine, command, self._tokenizer)
