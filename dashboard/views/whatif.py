"""What-if: replay an engine's recorded requests (their salted unit hashes: no prompt text)
under other settings on a Celery worker and see what each would have hit: a curve of hit rate
against memory for the settings that vary it, the settings ranked by tokens saved, and how
exactly the replay of what ran reproduced the engine's own hits. The form queues a run with
the write token the operator entered in the sidebar (disabled until they do)."""

import pandas as pd
import streamlit as st

from client.schema import EVICTION_NAMES
from client.transport import ApiError
from client.types import EngineOut, WhatIfRunOut
from dashboard.connection import (
    NEEDS_WRITE_TOKEN,
    START_ENGINE,
    api_client,
    api_errors,
    pick_engine,
    write_client,
    write_token_field,
)
from dashboard.figures.whatif import (
    agreement_text,
    curve_families,
    curve_figure,
    has_tiers,
    ranked_table,
    results_frame,
    settings_text,
    tier_curve_figure,
    tier_curves,
    tier_table,
)
from dashboard.forms.whatif import (
    BLOCK_SIZES,
    DEFAULT_MEMORY,
    MAMBA_BLOCK_SIZES,
    MAX_SETTINGS,
    MEMORY_FACTORS,
    UNITS,
    Choices,
    build_settings,
    offered,
    parse_extra,
)
from dashboard.live import live
from dashboard.notice import notify, show_notice
from dashboard.peers import is_peer

#: the tier sizes the form offers, in GiB: each one setting (the device pools as ran)
HOST_GIB = (1, 4, 16, 64, 256)
DISK_GIB = (64, 256, 1024, 4096)
NOTICE = "whatif_notice"
CHOSEN = "whatif_run"
ABOUT = (
    "A what-if replays the engine's recorded requests (the salted hashes of their prompts, "
    "kept by the control plane for `JUNCTION_WHATIF_MAX_REQUESTS` requests) through Junction's "
    "cache rules with other settings, on a `junction worker`. Each setting is compared with the "
    "oracle (no memory limit) and the bound under its memory."
)

st.title("What-if")
st.caption(ABOUT)
write_token_field()


def start_form(engine: EngineOut) -> None:
    """The settings to try and the Start button."""
    writer = write_client()  # None until the operator enters the token
    geometry = engine.geometry
    engine_id = engine.engine_id
    with st.expander("Try other settings", expanded=True):
        left, right = st.columns(2)
        vllm = left.checkbox("As vLLM would (aligned hits, LRU)", value=True, key="wi_vllm")
        memory = right.multiselect(
            "Memory (× the pools it ran with)",
            list(MEMORY_FACTORS),
            default=list(DEFAULT_MEMORY),
            format_func=lambda f: f"×{f:g}",
            key="wi_memory",
        )
        evictions = right.multiselect(
            "Eviction policies (each at every memory too)",
            list(EVICTION_NAMES),
            default=["lru"],
            key="wi_evictions",
        )
        block_sizes = left.multiselect(
            "Attention block size Ba", offered(BLOCK_SIZES, geometry), key="wi_ba"
        )
        mamba_sizes = left.multiselect(
            "Mamba block size Bm", offered(MAMBA_BLOCK_SIZES, geometry), key="wi_bm"
        )
        units = right.multiselect("Match unit U", offered(UNITS, geometry), key="wi_u")
        extra_text = st.text_area(
            "More settings (JSON: an object or a list, e.g. "
            '`{"checkpoint_interval": 256, "mode": "junction"}`)',
            value="",
            key="wi_extra",
        )
        try:
            extra = parse_extra(extra_text)
        except ValueError as exc:
            st.warning(f"The JSON box is not a setting or a list of them: {exc}")
            extra = ()
        choices = Choices(
            vllm, tuple(block_sizes), tuple(mamba_sizes), tuple(units), tuple(evictions),
            tuple(memory), extra,
        )  # fmt: skip
        settings = build_settings(choices, geometry) + tier_settings()
        st.caption(
            f"{len(settings)} settings, each replayed beside the engine's own"
            + (f" (at most {MAX_SETTINGS})." if len(settings) > MAX_SETTINGS else ".")
        )
        if writer is None:
            st.caption(NEEDS_WRITE_TOKEN.format(what="start a what-if"))
        can_start = writer is not None and 0 < len(settings) <= MAX_SETTINGS
        if st.button("Start what-if", type="primary", disabled=not can_start, key="wi_start"):
            try:
                run = writer.create_whatif(engine_id, settings)
            except ApiError as exc:
                notify(NOTICE, "error", f"Could not start the what-if: {exc}")
            else:
                st.session_state[CHOSEN] = run.id
                st.session_state.pop("whatif_chosen", None)  # the select box shows the new run
                notify(
                    NOTICE,
                    "success",
                    f"What-if **#{run.id}** queued ({len(settings)} settings over epoch "
                    f"{run.epoch}): a `junction worker` runs it; its progress shows below.",
                )
        show_notice(NOTICE)


def tier_settings() -> list[dict]:
    """The form's tier sizes: a setting for each host size, and for each disk size (over the
    largest host size chosen, else none): the curve per tier."""
    left, right = st.columns(2)
    host = left.multiselect(
        "Host memory tier (GiB; none ran)", list(HOST_GIB), key="wi_host",
        help="what a tier of host memory under the device pools would buy",
    )  # fmt: skip
    disk = right.multiselect(
        "Disk tier (GiB; none ran)", list(DISK_GIB), key="wi_disk",
        help="what a disk tier would buy, under the largest host tier chosen",
    )  # fmt: skip
    settings = [{"label": f"host {g} GiB", "host_cache_bytes": g << 30} for g in sorted(host)]
    top = max(host, default=0)
    for gib in sorted(disk):
        label = f"disk {gib} GiB" + (f" under host {top} GiB" if top else "")
        settings.append(
            {"label": label, "host_cache_bytes": top << 30, "disk_cache_bytes": gib << 30}
        )
    return settings


def runs_frame(runs: list[WhatIfRunOut]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "id": run.id,
                "status": run.status,
                "progress": run.progress_done / run.progress_total
                if run.progress_total
                else (1.0 if run.status == "done" else 0.0),
                "settings": settings_text(run.settings),
                "created": run.created_at,
                "error": run.error or "",
            }
            for run in runs
        ]
    )


def show_run(run: WhatIfRunOut) -> None:
    """A run's progress, its failure, or its report."""
    if run.status in ("queued", "running"):
        total, done = run.progress_total, run.progress_done
        text = f"{run.status}: {done:,} of {total:,} requests replayed" if total else "queued"
        st.progress(done / total if total else 0.0, text=text)
        return
    if run.status == "failed":
        st.error(f"What-if #{run.id} failed: {run.error}")
        return
    report = run.report
    st.markdown(f"**{agreement_text(report)}**")
    for result in report.results:
        for pin in result.pins_not_placed:
            st.warning(f"{result.label}: pin {pin['pin']!r} not placed ({pin['reason']})")
    frame = results_frame(report)
    if curve_families(frame):
        st.markdown("**Token hit rate against memory** (each setting tried at several memories)")
        st.plotly_chart(curve_figure(frame), key="whatif_curve")
    else:
        st.info("No setting varied memory: add memory ×0.5 or ×2 to draw the curve.")
    if has_tiers(frame):
        show_tiers(frame)
    st.markdown("**The settings tried, most tokens saved first**")
    st.dataframe(
        ranked_table(frame),
        hide_index=True,
        column_config={
            "hit rate": st.column_config.NumberColumn(format="%.1f%%"),
            "% of oracle": st.column_config.NumberColumn(format="%.1f%%"),
            "% of bound": st.column_config.NumberColumn(format="%.1f%%"),
            "gain vs as ran": st.column_config.NumberColumn(format="%+d"),
        },
    )


def show_tiers(frame: pd.DataFrame) -> None:
    """The curve per tier (settings that vary one tier's size) and the hits by tier."""
    if tier_curves(frame):
        st.markdown(
            "**Token hit rate against tier size** (the device pools as ran; dotted: the share "
            "that tier served)"
        )
        st.plotly_chart(tier_curve_figure(frame), key="whatif_tier_curve")
    else:
        st.info("No tier was tried at several sizes: choose more host or disk sizes.")
    st.markdown("**Hit tokens by tier** (a load counts to the farthest tier it read)")
    st.dataframe(
        tier_table(frame),
        hide_index=True,
        column_config={"hit rate": st.column_config.NumberColumn(format="%.1f%%")},
    )


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def runs_of(engine_id: str) -> None:
    """The engine's runs, and the one chosen (the one just started, the `?run=` of the URL,
    else the newest)."""

    def body() -> None:
        with api_errors():
            page = api_client().whatif_runs(engine_id)
            runs = page.runs
            if not runs:
                st.info(
                    f"No what-if of {engine_id} yet: pick settings above and start one (or "
                    f"`POST /api/v1/engines/{engine_id}/whatif`)."
                )
                return
            st.dataframe(
                runs_frame(runs),
                hide_index=True,
                column_config={
                    "progress": st.column_config.ProgressColumn(
                        "progress", min_value=0, max_value=1
                    )
                },
            )
            ids = [run.id for run in runs]
            wanted = st.session_state.get(CHOSEN) or _int(st.query_params.get("run"))
            chosen = st.selectbox(
                "Report of run",
                ids,
                index=ids.index(wanted) if wanted in ids else 0,
                format_func=lambda i: f"#{i}",
                key="whatif_chosen",
            )
            show_run(next(run for run in runs if run.id == chosen))

    live(body)


with api_errors():
    engine = pick_engine(api_client().engines(), key="whatif_engine")
    if engine is None:
        st.info(START_ENGINE.format(url=api_client().base_url))
    elif is_peer(engine):
        st.info(
            "This engine is bridged from vLLM or SGLang: it reports no unit hashes, so there is "
            "no recording of its requests to replay."
        )
    else:
        start_form(engine)
        runs_of(engine.engine_id)
