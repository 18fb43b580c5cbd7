"""`TextStream`: generated tokens to text deltas, safe to send as they come.

Two things are held back until later tokens settle them: what the tokenizer's detokenizer
holds (the bytes of a character not yet complete, so a character is never split across
deltas), and text that might be the start of a stop string (so a stop string is never half
sent). The deltas always join to `text`, the whole output as the detokenizer decodes it, cut
before the first stop string.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.model.tokenizer import ByteDetokenizer, Detokenizer


class TextStream:
    def __init__(self, stop: Sequence[str] = (), detokenizer: Detokenizer | None = None) -> None:
        """`detokenizer` defaults to the byte tokenizer's."""
        self._detokenizer = detokenizer if detokenizer is not None else ByteDetokenizer()
        self._stop = [s for s in stop if s]
        self._text = ""  # decoded so far, cut at a matched stop string
        self._num_sent = 0  # characters of `_text` already returned
        self.is_stopped = False  # a stop string matched: the output ends here
        self.stop_string: str | None = None  # the one that matched first

    @property
    def text(self) -> str:
        return self._text

    def push(self, token_ids: Sequence[int]) -> str:
        """Take new tokens; returns the text that is now settled."""
        if self.is_stopped:
            return ""
        self._extend(self._detokenizer.push(token_ids))
        return self._take(self._held_back())

    def finish(self) -> str:
        """The output has ended: flush what was held back (a broken character is replaced)."""
        if not self.is_stopped:
            self._extend(self._detokenizer.finish())
        return self._take(0)

    def _extend(self, new_text: str) -> None:
        if not new_text:
            return
        # a stop string may straddle the old and new text, but not what was already sent
        start = max(self._num_sent, len(self._text) - max(map(len, self._stop), default=0) + 1)
        self._text += new_text
        found = [(i, s) for s in self._stop if (i := self._text.find(s, start)) >= 0]
        if found:
            at, self.stop_string = min(found)
            self._text = self._text[:at]
            self.is_stopped = True

    def _held_back(self) -> int:
        """Characters at the end that could still grow into a stop string."""
        if self.is_stopped:
            return 0
        tail = self._text[self._num_sent :]
        return max(
            (
                k
                for s in self._stop
                for k in range(min(len(s) - 1, len(tail)), 0, -1)
                if tail.endswith(s[:k])
            ),
            default=0,
        )

    def _take(self, held_back: int) -> str:
        end = len(self._text) - held_back
        delta = self._text[self._num_sent : end]
        self._num_sent = max(self._num_sent, end)
        return delta
