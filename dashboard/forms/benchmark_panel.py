"""The Benchmarks page's form: a preset (the quick spec by default, or one of the standard
suite's), the spec's fields, what the run will replay (counted before it is queued), and an
Enqueue button that queues it through `POST /benchmarks` with the write token the operator
entered in the sidebar; the run's id stays up after it is queued."""

from __future__ import annotations

import json

import streamlit as st

from client.rest import ApiClient
from client.schema import MODES
from client.transport import ApiError
from dashboard.connection import NEEDS_WRITE_TOKEN, api_client, write_client
from dashboard.forms.benchmark import (
    LONG_RUN_REPLAYS,
    QUICK,
    QUICK_NAME,
    QUICK_NOTE,
    QUICK_SIZE,
    RUNNERS,
    Estimate,
    estimate,
    presets,
)
from dashboard.notice import notify, show_notice

NOTICE = "benchmarks_notice"
NOT_RECORDED = (
    "This page lists the runs queued through the form below or `POST /api/v1/benchmarks` "
    "(a `junction worker` runs them). A `junction bench` on the command line prints its "
    "results in the terminal and is not recorded here: to record a spec, enqueue it here or "
    "`POST` it to `/api/v1/benchmarks`."
)


def spec_fields(preset_name: str, preset: dict) -> dict:
    """The form's fields, keyed by preset (a new preset brings its own values); the workload
    stays the JSON text the operator typed."""
    runner = preset.get("runner", "ledger")
    return {
        "name": st.text_input("Name", value=preset["name"], key=f"bench_name_{preset_name}"),
        "workload": st.text_area(
            "Workload (JSON)",
            value=json.dumps(preset["workload"], indent=1),
            key=f"bench_workload_{preset_name}",
        ),
        "modes": st.multiselect(
            "Modes",
            list(MODES),
            default=preset.get("modes", list(MODES)),
            key=f"bench_modes_{preset_name}",
        ),
        "runner": st.selectbox(
            "Runner",
            RUNNERS,
            index=RUNNERS.index(runner) if runner in RUNNERS else 0,
            key=f"bench_runner_{preset_name}",
        ),
        "concurrency": int(
            st.number_input(
                "Concurrency",
                1,
                4096,
                int(preset.get("concurrency", 8)),
                key=f"bench_concurrency_{preset_name}",
            )
        ),
    }


def size_of(fields: dict) -> Estimate | None:
    """The run's size shown before it is queued; None (and why) when the spec will not build."""
    try:
        size = estimate(json.loads(fields["workload"]), fields["modes"])
    except ValueError as exc:  # json's and pydantic's errors are ValueErrors
        st.warning(f"No estimate: the workload is not one the worker can build ({exc}).")
        return None
    st.info(size.text(fields["runner"]))
    if size.num_replays > LONG_RUN_REPLAYS:
        st.warning(
            f"{size.num_replays:,} requests can take many minutes, and the worker runs one run "
            f"at a time: the {QUICK_NAME} preset replays {QUICK_SIZE.num_replays:,}."
        )
    return size


def enqueue(writer: ApiClient, fields: dict, preset: dict, size: Estimate | None) -> None:
    """Queue the spec; its run id (or why it was refused) stays up under the button."""
    try:
        spec = {**fields, "workload": json.loads(fields["workload"])}
        if "geometry" in preset:
            spec["geometry"] = preset["geometry"]
        run = writer.create_benchmark(spec)
    except json.JSONDecodeError as exc:
        notify(NOTICE, "error", f"The workload is not JSON: {exc}")
    except ApiError as exc:
        notify(NOTICE, "error", f"Could not enqueue the run: {exc}")
    else:
        what = f", {size.num_replays:,} requests" if size is not None else ""
        notify(
            NOTICE,
            "success",
            f"Run **#{run.id}** ({run.name}{what}) queued: a `junction worker` runs it, "
            "and its progress shows in the table below.",
        )


def enqueue_form() -> None:
    """The form, inside an expander; disabled until the operator enters the write token."""
    writer = write_client()
    with st.expander("Start a benchmark run", expanded=False):
        try:
            suite = presets(api_client())
        except ApiError as exc:  # the form still takes the quick spec; the runs below say why
            suite = {}
            st.caption(f"The standard suite's presets could not be read: {exc}")
        preset_name = st.selectbox("Preset", [QUICK_NAME, *suite], key="bench_preset")
        preset = suite.get(preset_name, QUICK)
        st.caption(QUICK_NOTE)
        fields = spec_fields(preset_name, preset)
        size = size_of(fields)
        if writer is None:
            st.caption(NEEDS_WRITE_TOKEN.format(what="queue a run"))
        if st.button("Enqueue", type="primary", disabled=writer is None, key="bench_enqueue"):
            if writer is not None:  # nothing is sent without the session's token
                enqueue(writer, fields, preset, size)
        show_notice(NOTICE)
