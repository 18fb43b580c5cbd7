"""Benchmarks: the runs queued through the form or `POST /benchmarks` (never a `junction
bench` on the command line) and, for a finished one, hit rate and TTFT by mode against the
oracle; the form (`dashboard.forms.benchmark_panel`) enqueues a run with the write token the
operator entered in the sidebar (disabled until they do)."""

import streamlit as st

from dashboard.connection import api_client, api_errors, write_token_field
from dashboard.figures.benchmarks import (
    hit_rate_by_mode_figure,
    modes_frame,
    modes_table,
    ttft_by_mode_figure,
)
from dashboard.forms.benchmark import runs_frame
from dashboard.forms.benchmark_panel import NOT_RECORDED, enqueue_form
from dashboard.live import live

st.title("Benchmarks")
st.caption(NOT_RECORDED)
write_token_field()
enqueue_form()


def body() -> None:
    with api_errors():
        page = api_client().benchmarks()
        runs = page.runs
        if not runs:
            st.info(
                "No benchmark run yet: enqueue one with the form above (or `POST "
                "/api/v1/benchmarks`); a Celery worker (`junction worker`) runs queued runs."
            )
            return
        st.caption(f"The {len(runs)} newest of {page.total} runs.")
        st.dataframe(
            runs_frame(runs),
            hide_index=True,
            column_config={
                "progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=1)
            },
        )
        finished = [run for run in runs if run.status == "finished" and run.results]
        if not finished:
            st.info("No run has finished yet; results appear here when one does.")
            return
        labels = {run.id: f"#{run.id} {run.name}" for run in finished}
        chosen = st.selectbox(
            "Results of run", list(labels), format_func=labels.get, key="bench_run"
        )
        run = next(r for r in finished if r.id == chosen)
        frame = modes_frame(run)
        left, right = st.columns(2)
        left.markdown("**Token hit rate by mode, against the oracle**")
        left.plotly_chart(hit_rate_by_mode_figure(frame), key="bench_hit_rate")
        right.markdown("**Time to first token by mode**")
        right.plotly_chart(ttft_by_mode_figure(frame), key="bench_ttft")
        st.dataframe(modes_table(frame), hide_index=True)


live(body)
