"""Benchmarks: past runs and, for a finished one, hit rate and TTFT by mode against the
oracle; a form that enqueues a run through `POST /benchmarks`, with the write token the
operator entered in the sidebar (disabled until they do)."""

import json

import streamlit as st

from client.schema import MODES
from client.transport import ApiError
from dashboard.benchmark_form import CUSTOM, RUNNERS, presets, runs_frame
from dashboard.connection import NEEDS_WRITE_TOKEN, api_client, api_errors, write_client
from dashboard.figures.benchmarks import (
    hit_rate_by_mode_figure,
    modes_frame,
    modes_table,
    ttft_by_mode_figure,
)
from dashboard.live import live

NOTICE = "benchmarks_notice"

st.title("Benchmarks")
api = api_client()
writer = write_client()  # None: the operator has not entered the write token


with st.expander("Start a benchmark run", expanded=False):
    try:
        suite = presets(api)
    except ApiError as exc:  # the form still takes a custom spec; the runs below say why
        suite = {}
        st.caption(f"The standard suite's presets could not be read: {exc}")
    preset_name = st.selectbox("Preset", ["custom", *suite], key="bench_preset")
    preset = suite.get(preset_name, CUSTOM)
    with st.form("bench_form"):
        name = st.text_input("Name", value=preset["name"])
        workload = st.text_area("Workload (JSON)", value=json.dumps(preset["workload"], indent=1))
        modes = st.multiselect("Modes", list(MODES), default=preset.get("modes", list(MODES)))
        preset_runner = preset.get("runner", "ledger")
        runner = st.selectbox(  # keyed by preset: a new preset brings its own runner
            "Runner",
            RUNNERS,
            index=RUNNERS.index(preset_runner) if preset_runner in RUNNERS else 0,
            key=f"bench_runner_{preset_name}",
        )
        concurrency = st.number_input("Concurrency", 1, 4096, int(preset.get("concurrency", 8)))
        if writer is None:
            st.caption(NEEDS_WRITE_TOKEN.format(what="queue a run"))
        enqueue = st.form_submit_button("Enqueue", type="primary", disabled=writer is None)
        if enqueue and writer is not None:  # nothing is sent without the session's token
            try:
                spec = {
                    "name": name,
                    "workload": json.loads(workload),
                    "runner": runner,
                    "modes": modes,
                    "concurrency": int(concurrency),
                }
                if "geometry" in preset:
                    spec["geometry"] = preset["geometry"]
                run = writer.create_benchmark(spec)
                st.session_state[NOTICE] = ("success", f"Run {run['id']} ({run['name']}) queued.")
            except json.JSONDecodeError as exc:
                st.session_state[NOTICE] = ("error", f"The workload is not JSON: {exc}")
            except ApiError as exc:
                st.session_state[NOTICE] = ("error", f"Could not enqueue the run: {exc}")


def body() -> None:
    notice = st.session_state.pop(NOTICE, None)
    if notice is not None:
        (st.error if notice[0] == "error" else st.success)(notice[1])
    with api_errors(api):
        page = api.benchmarks()
        runs = page["runs"]
        if not runs:
            st.info(
                "No benchmark run yet: start one with the form above, or `junction bench`; "
                "a Celery worker (`junction worker`) runs queued runs."
            )
            return
        st.caption(f"The {len(runs)} newest of {page['total']} runs.")
        st.dataframe(
            runs_frame(runs),
            hide_index=True,
            column_config={
                "progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=1)
            },
        )
        finished = [run for run in runs if run["status"] == "finished" and run.get("results")]
        if not finished:
            st.info("No run has finished yet; results appear here when one does.")
            return
        labels = {run["id"]: f"#{run['id']} {run['name']}" for run in finished}
        chosen = st.selectbox(
            "Results of run", list(labels), format_func=labels.get, key="bench_run"
        )
        run = next(r for r in finished if r["id"] == chosen)
        frame = modes_frame(run)
        left, right = st.columns(2)
        left.markdown("**Token hit rate by mode, against the oracle**")
        left.plotly_chart(hit_rate_by_mode_figure(frame), key="bench_hit_rate")
        right.markdown("**Time to first token by mode**")
        right.plotly_chart(ttft_by_mode_figure(frame), key="bench_ttft")
        st.dataframe(modes_table(frame), hide_index=True)


live(body)
