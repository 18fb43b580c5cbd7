"""`Body`, the base of every REST answer's struct."""

from __future__ import annotations

import msgspec


class Body(msgspec.Struct, kw_only=True):
    """A REST answer's body: fields by name, those a newer API adds ignored."""
