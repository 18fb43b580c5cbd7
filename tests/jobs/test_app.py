"""The Celery app: its configuration from the settings, the beat schedule, the commands."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from celery.schedules import crontab

import jobs.tasks  # noqa: F401 (registers the tasks, as the worker's `include` does)
from api.runs.broker import TASK_RUN, transport_options
from api.settings import Settings
from cli.main import build_parser
from jobs.app import TASK_SUITE, TASK_SWEEP, app, beat_schedule, celery_config, parse_crontab
from jobs.cli import worker_argv


def test_the_beat_schedule_names_registered_tasks() -> None:
    schedule = app.conf.beat_schedule
    assert {entry["task"] for entry in schedule.values()} == {TASK_SUITE, TASK_SWEEP}
    for entry in schedule.values():
        assert entry["task"] in app.tasks
    assert TASK_RUN in app.tasks
    assert app.conf.timezone == "UTC" and app.conf.enable_utc


def test_the_suite_runs_on_the_settings_crontab() -> None:
    settings = Settings(_env_file=None, benchmark_schedule="30 2 * * 1-5")
    entry = beat_schedule(settings)["standard-suite"]
    assert entry["task"] == TASK_SUITE
    schedule = entry["schedule"]
    assert isinstance(schedule, crontab)
    assert (
        schedule.minute == {30}
        and schedule.hour == {2}
        and schedule.day_of_week == set(range(1, 6))
    )
    # nightly default: due at 03:00 UTC
    nightly = parse_crontab(Settings(_env_file=None).benchmark_schedule)
    assert nightly.minute == {0} and nightly.hour == {3}
    start, delta, _ = nightly.remaining_delta(datetime(2026, 11, 29, 3, 0, tzinfo=UTC))
    assert start + delta == datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("0 3 * *", "must have 5 crontab fields"), ("0 25 * * *", "not a valid crontab")],
)
def test_a_bad_crontab_says_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_crontab(spec)


def test_the_config_comes_from_the_settings() -> None:
    settings = Settings(
        _env_file=None, broker_url="redis://r:6379/2", result_backend="redis://r:6379/3"
    )
    config = celery_config(settings)
    assert config["broker_url"] == "redis://r:6379/2"
    assert config["result_backend"] == "redis://r:6379/3"
    assert config["task_acks_late"] and config["worker_prefetch_multiplier"] == 1
    assert "visibility_timeout" in config["broker_transport_options"]
    assert transport_options("sqla+sqlite:///b.db") == {"connect_args": {"timeout": 30}}
    embedded = celery_config(Settings(_env_file=None))
    assert embedded["broker_url"].startswith("sqla+sqlite:///")
    assert embedded["result_backend"].startswith("db+sqlite:///")
    task = app.tasks[TASK_RUN]
    assert task.acks_late and task.reject_on_worker_lost and task.max_retries == 2


def test_worker_and_beat_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(["worker", "--concurrency", "2", "-Q", "a,b", "--loglevel", "debug"])
    assert worker_argv(args) == ["worker", "--loglevel=debug", "--concurrency=2", "--queues=a,b"]
    beat = parser.parse_args(["beat", "--schedule", "/tmp/beat"])
    assert beat.schedule == "/tmp/beat" and beat.func.__name__ == "run_beat"
