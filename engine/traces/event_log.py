"""`EventLog`: a sink that writes each cache event as one JSON line the moment it is emitted.

What `junction replay --events-out` streams to: the file grows, the process does not. The
lines are the events' `to_dict()` form, the `events` of the control plane's batches.
"""

from __future__ import annotations

import json
from typing import TextIO

from engine.events import CacheEvent


class EventLog:
    is_recording = True

    def __init__(self, handle: TextIO) -> None:
        self.handle = handle
        self.num_events = 0
        self._encode = json.JSONEncoder(separators=(",", ":")).encode

    def emit(self, event: CacheEvent) -> None:
        self.handle.write(self._encode(event.to_dict()))
        self.handle.write("\n")
        self.num_events += 1
