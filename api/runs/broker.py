"""The API's side of the Celery broker: how a queued run's message is put on it.

The API sends `TASK_RUN` (a benchmark run) and `TASK_WHATIF` (a what-if run) by name, so it
imports neither the tasks nor the engine's runners; the worker that runs them is `jobs.app`,
which takes the transport options and the tasks' names from here.
Celery and kombu load on the first message sent, not at import.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Celery itself loads on the first message sent
    from celery import Celery

TASK_RUN = "junction.run_benchmark"
TASK_WHATIF = "junction.run_whatif"
#: Redis redelivers a message not acked within this (acks are late: after the run). Longer
#: than any run, so a live run is never delivered twice; a lost one is swept well before.
VISIBILITY_TIMEOUT_S = 12 * 3600


class BrokerUnavailable(RuntimeError):
    """The run's message could not be put on the broker."""


def transport_options(broker_url: str) -> dict[str, Any]:
    if broker_url.startswith("sqla+sqlite"):
        # SQLAlchemy engine options: wait for SQLite's lock instead of failing at once
        return {"connect_args": {"timeout": 30}}
    if broker_url.startswith(("redis", "rediss")):
        return {"visibility_timeout": VISIBILITY_TIMEOUT_S}
    return {}


@lru_cache(maxsize=8)
def producer(broker_url: str) -> Celery:
    """A Celery app that only sends (no result backend: the store holds the outcome)."""
    from celery import Celery

    sender = Celery("junction-producer", set_as_current=False)
    sender.conf.update(
        broker_url=broker_url,
        broker_transport_options=transport_options(broker_url),
        broker_connection_timeout=3,
        task_serializer="json",
        accept_content=["json"],
    )
    return sender


def send_run(broker_url: str, run_id: int, task_id: str) -> None:
    """Put benchmark run `run_id`'s message on the broker, or raise `BrokerUnavailable`."""
    send_task(broker_url, TASK_RUN, run_id, task_id)


def send_whatif(broker_url: str, run_id: int, task_id: str) -> None:
    """Put what-if run `run_id`'s message on the broker, or raise `BrokerUnavailable`."""
    send_task(broker_url, TASK_WHATIF, run_id, task_id)


def send_task(broker_url: str, task: str, run_id: int, task_id: str) -> None:
    """Send `task(run_id)` as `task_id`, or raise `BrokerUnavailable` saying where."""
    from kombu.exceptions import OperationalError as KombuOperationalError
    from kombu.utils.url import maybe_sanitize_url

    try:
        producer(broker_url).send_task(
            task,
            args=[run_id],
            task_id=task_id,
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.3},
        )
    except (KombuOperationalError, OSError) as exc:
        raise BrokerUnavailable(
            f"the Celery broker at {maybe_sanitize_url(broker_url)} is unreachable: {exc}"
        ) from exc
