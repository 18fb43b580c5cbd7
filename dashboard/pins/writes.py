"""The Checkpoints page's writes (pin, unpin, pin a suggested junction): each runs from a
button or the form with the write token the operator entered in the sidebar, and its outcome
stays up for `dashboard.notice.NOTICE_S` seconds, across the live refreshes that rerun the page."""

from __future__ import annotations

from client.rest import ApiClient
from client.transport import ApiError
from dashboard import notice
from dashboard.connection import NEEDS_WRITE_TOKEN
from dashboard.pins.text import pin_line

NOTICE = "checkpoints_notice"


def act(writer: ApiClient | None, what: str, call: str, *args) -> None:
    """Run the API write `call` (an `ApiClient` method) with the session's write token; its
    outcome shows on the next run."""
    if writer is None:  # the controls are disabled; nothing is sent without the token
        notify("error", NEEDS_WRITE_TOKEN.format(what=what.lower()))
        return
    try:
        result = getattr(writer, call)(*args)
    except ApiError as exc:
        notify("error", f"{what} failed: {exc}")
    else:
        notify("success", f"{what}: done ({pin_line(result)})")


def notify(kind: str, text: str) -> None:
    """Keep a write's outcome for `NOTICE_S` seconds, across the live refreshes."""
    notice.notify(NOTICE, kind, text)


def show_notice() -> None:
    """The last write's outcome, while it is younger than `NOTICE_S` seconds."""
    notice.show_notice(NOTICE)
