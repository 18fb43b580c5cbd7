"""Every part's settings, checked before `junction up` starts anything: the control plane's
(`api.settings`), its clients' (`client.settings`: the engine and the dashboard) and,
with the jobs, the beat's crontab, parsed by the function the beat uses. A part that found
its settings bad only once started would take the stack down after the others came up."""

from __future__ import annotations

from pydantic import ValidationError

from client.settings_errors import bad_fields, describe


def settings_problems(with_jobs: bool = True) -> list[str]:
    """One line a bad setting (`JUNCTION_NAME='value': what it accepts`); empty: all good.
    This reads the environment and `.env`, and changes nothing."""
    from api.settings import Settings
    from client.settings import ControlPlaneSettings, DashboardSettings

    problems: list[str] = []
    try:
        settings = Settings()
    except ValidationError as exc:
        problems += describe(exc)
        # the rest as given, the bad ones at their defaults, so the crontab is checked too
        defaults = {name: Settings.model_fields[name].get_default() for name in bad_fields(exc)}
        settings = Settings(**defaults)
    for client_settings in (ControlPlaneSettings, DashboardSettings):
        try:
            client_settings()
        except ValidationError as exc:
            problems += [problem for problem in describe(exc) if problem not in problems]
    if with_jobs:
        from jobs.app import parse_crontab

        try:
            parse_crontab(settings.benchmark_schedule)
        except ValueError as exc:
            problems.append(str(exc))
    return problems
