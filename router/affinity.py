"""`KeyAffinity`: OpenAI's `prompt_cache_key` as a routing hint: the requests of one key go to
one engine (the key's home) while its load allows.

A key names requests the client expects to share a prefix (one user's conversation, one
agent's session), including prefixes the router cannot see yet: the next turn's, or one below
the policy's `--min-hit-share`. It is a hint, not a salt: the engines cache by prefix alone. A
new key goes where the policy sends its first request; after that the key's home is chosen
unless the request's predicted prefill seconds there exceed those on the policy's choice by
more than `spill_s`, when the request and the key move to the policy's choice. Load and hits
count alike there: a home much busier than another engine, or a far longer hit elsewhere, moves
the key. (OpenAI's keys overflow to more machines too, once one prefix and key come faster than
about 15 requests a minute, its documentation says.) A home that is down or refused the request
is left the same way. The map is bounded: the least recently used key goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from router.policies import Choice

#: Keys kept (the least recently used dropped first). A key is at most 256 characters
#: (`protocol.schemas`), so an entry is under half a kilobyte and the map under 50 MB.
DEFAULT_MAX_KEYS = 100_000
#: How many predicted prefill seconds a request may lose by staying on its key's engine. Half
#: a second is about what a chat client notices in its time to first token; at the default
#: prefill rate (20,000 tokens/s) it is a queue of 10,000 tokens more than the best engine's,
#: a few long prompts, so a key stays put through the ordinary jitter of load (one running
#: request weighs 128 tokens, 6 ms) and moves once its engine is clearly busier than the rest.
#: `junction route --cache-key-spill-s`.
DEFAULT_SPILL_S = 0.5
KEPT = "cache_key"  # the reason of a decision that kept the key's home
SPILLED = "cache_key_spill"  # the home was too busy: the request and the key moved


class Steer(NamedTuple):
    choice: Choice  # the policy's choice, or the key's home in its place
    home: str | None  # the key's engine before this request (None: a key not seen)


class KeyAffinity:
    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS, spill_s: float = DEFAULT_SPILL_S) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be positive, got {max_keys}")
        if not spill_s >= 0:
            raise ValueError(f"--cache-key-spill-s must be >= 0, got {spill_s}")
        self.max_keys = max_keys
        self.spill_s = spill_s
        self.homes: OrderedDict[str, str] = OrderedDict()  # key -> engine URL, oldest use first

    def steer(
        self, key: str | None, choice: Choice, seconds: dict[str, float], record: bool = True
    ) -> Steer:
        """The engine for a request of `key` (None: the policy's choice as it is), given each
        candidate's predicted prefill seconds; the key's home becomes the engine chosen (unless
        not `record`: a decision asked for and not sent, `POST /fleet/route`)."""
        if key is None:
            return Steer(choice, None)
        home = self.homes.get(key)
        if home in seconds:
            if seconds[home] - seconds[choice.key] <= self.spill_s:
                choice = choice._replace(key=home, reason=KEPT)
            else:
                choice = choice._replace(reason=SPILLED)
        if not record:
            return Steer(choice, home)
        self.homes[key] = choice.key
        self.homes.move_to_end(key)
        while len(self.homes) > self.max_keys:
            self.homes.popitem(last=False)
        return Steer(choice, home)
