"""Block tables: every physical block of one engine's group as a cell coloured by state, a
request's blocks outlined with its hit boundary, recent copies and moves as links."""

import pandas as pd
import streamlit as st

from client.rest import ApiClient, ApiError
from client.schema import GROUPS
from client.types import BlockGrid, EngineOut, RequestOut
from dashboard.connection import START_ENGINE, api_client, api_errors, pick_engine
from dashboard.figures.block_grid import block_grid_figure
from dashboard.figures.tiers import tier_style, tier_units_frame, tier_usage_frame
from dashboard.grid.arrows import MAX_ARROWS, Arrows, arrows, link_frame
from dashboard.grid.cells import MAX_CELLS, grid_cells
from dashboard.grid.outline import request_outline
from dashboard.groups import group_label
from dashboard.live import live
from dashboard.peers import PEER_PAGE, PEER_PAGE_LABEL, is_peer, why_empty

st.title("Block tables")


def block_size(engine: EngineOut, group: str) -> int:
    return engine.geometry.group_block_size(group) or 1


def find_request(engine_id: str, request_id: str) -> RequestOut | None:
    try:
        return api_client().request(engine_id, request_id)
    except ApiError as exc:
        if exc.status == 404:
            st.warning(f"No finished request {request_id!r} on engine {engine_id}.")
            return None
        raise


def table_ids(ids: list[int | None]) -> str:
    """A block table's ids; a sparse one (Mamba keeps only its checkpoints and last block)
    as `#slot: id` of the held slots, with the count of empty ones."""
    shown = ids[:64]
    more = " …" if len(ids) > 64 else ""
    if all(b is not None for b in ids):
        return ", ".join(map(str, shown)) + more
    held = ", ".join(f"#{i}: {b}" for i, b in enumerate(shown) if b is not None)
    empty = sum(b is None for b in ids)
    return f"{held or 'none held'}{more} ({empty} of {len(ids)} slots hold no block)"


def request_summary(request: RequestOut, engine: EngineOut) -> pd.DataFrame:
    rows = []
    for group in GROUPS:
        ids = request.block_ids.get(group, [])
        size = block_size(engine, group)
        rows.append(
            {
                "group": group,
                "hit (tokens)": request.hit_tokens_by_group.get(group, 0),
                "blocks": len([b for b in ids if b is not None]),
                "hit boundary in block": (
                    f"#{min(request.num_cached_tokens // size, len(ids) - 1)} of its table"
                    if ids
                    else "none"
                ),
                "block ids": table_ids(ids),
            }
        )
    return pd.DataFrame(rows)


def arrows_caption(drawn: Arrows, request_id: str) -> str:
    whose = f"request {request_id}'s" if request_id else "recent"
    text = (
        f"Arrows: {len(drawn.frame)} for {drawn.num_links} {whose} copies and moves "
        "(one arrow for all those between the same two cells)"
    )
    if drawn.num_hidden:
        text += f"; {drawn.num_hidden} older not drawn (at most {MAX_ARROWS} arrows)"
    if not request_id:
        text += ". Find a request above to draw only its own"
    return text + "."


@st.cache_data(ttl=600, max_entries=16, show_spinner=False)
def fetch_grid(
    base_url: str,
    token: str | None,
    engine_id: str,
    group: str,
    start: int,
    stop: int | None,
    version: tuple,
) -> BlockGrid:
    """The grid, fetched again only when the engine's table may have changed (`version`: its
    epoch and next seq), so live refreshes of an idle engine cost one small request."""
    return ApiClient(base_url, token).block_grid(
        engine_id, group, start=start, stop=stop, keys=True, max_cells=MAX_CELLS
    )


def pool_size(engine: EngineOut, group: str) -> int:
    return engine.geometry.group_num_blocks(group) or 0


def draw(engine_id: str, group: str, request_id: str, zoom_start: int | None) -> None:
    engine = next((e for e in api_client().engines() if e.engine_id == engine_id), None)
    if engine is None:
        st.warning(f"Engine {engine_id} is gone from the control plane.")
        return
    stop = None if zoom_start is None else zoom_start + MAX_CELLS
    version = (engine.epoch, engine.next_seq)
    api = api_client()
    grid = fetch_grid(api.base_url, api.token, engine_id, group, zoom_start or 0, stop, version)
    num_blocks = grid.num_blocks
    if not num_blocks:
        st.info(f"Engine {engine_id} has reported no {group} blocks yet.")
        return
    cells = grid_cells(grid)
    shown = grid.stop - grid.start
    if cells.is_aggregated:
        st.warning(
            f"{num_blocks:,} {group} blocks: more than a browser draws well one cell each "
            f"(up to {MAX_CELLS:,}), so each cell aggregates {cells.blocks_per_cell} "
            "consecutive blocks and takes the most notable state among them (pinned, then "
            "copy-on-write target, in use, cached partial, cached full, free); hover a cell "
            "for its counts. Zoom in above to see single blocks with their keys."
        )
    else:
        st.caption(
            f"Blocks {grid.start:,}-{grid.stop - 1:,} of {num_blocks:,} {group} blocks, "
            f"one cell each ({shown:,} drawn). Hover a cell for its keys, tokens, checkpoint "
            "reason, reference count and last change."
        )
    links = link_frame(grid, cells)
    outline = boundary = None
    own = ""  # the request whose links alone are drawn
    if request_id:
        request = find_request(engine_id, request_id)
        if request is not None:
            ids = request.block_ids.get(group, [])
            outline, boundary = request_outline(
                ids, request.num_cached_tokens, block_size(engine, group), cells
            )
            st.markdown(
                f"Request **{request_id}**: {request.num_prompt_tokens:,} prompt tokens, "
                f"hit **{request.num_cached_tokens:,}**. Its blocks when it finished "
                "(outlined; blocks freed since may hold other prefixes now):"
            )
            st.dataframe(request_summary(request, engine), hide_index=True)
            if (links["request_id"] == request_id).any():
                own = request_id
    drawn = arrows(links, own)
    figure = block_grid_figure(
        cells.frame,
        cells.width,
        cells.blocks_per_cell,
        grid.start,
        links=drawn.frame,
        outline=outline,
        boundary=boundary,
    )
    st.plotly_chart(figure, key="block_grid")
    if len(links):
        st.caption(arrows_caption(drawn, own))
        st.markdown(f"**Recent copies and moves** ({len(links)}, newest last)")
        st.dataframe(
            links[["kind", "path", "src", "dst", "request_id", "step", "seq"]].tail(50),
            hide_index=True,
        )
    else:
        st.caption("No copy or move in the engine's recent event batches.")
    below_device(engine_id)


def below_device(engine_id: str) -> None:
    """The units the engine's tiers below the device hold, coloured by tier."""
    page = api_client().tier_units(engine_id, limit=500)
    if not page.tiers:
        return
    st.markdown("**Below the device: the units each tier holds** (every grid cell is `device`)")
    st.dataframe(tier_usage_frame(page), hide_index=True)
    if page.units:
        st.caption(f"{len(page.units):,} of {page.total:,} units, by tier then token range.")
        st.dataframe(tier_style(tier_units_frame(page)), hide_index=True, key="tier_units")


with api_errors():
    engines = api_client().engines()
    engine = pick_engine(engines, key="blocks_engine")
    if engine is None:
        st.info(START_ENGINE.format(url=api_client().base_url))
    elif is_peer(engine):
        st.info(why_empty(engine, "block table of physical blocks"))
        st.page_link(PEER_PAGE, label=PEER_PAGE_LABEL, icon=":material/account_tree:")
    else:
        left, middle, right = st.columns([1, 2, 2])
        wanted = st.query_params.get("group")
        group = left.radio(
            "Group",
            GROUPS,
            index=GROUPS.index(wanted) if wanted in GROUPS else 0,
            format_func=lambda g: group_label(engine, g),
            key="blocks_group",
            horizontal=True,
        )
        request_id = middle.text_input(
            "Find a request by id",
            value=st.query_params.get("request", ""),
            key="blocks_request",
            placeholder="e.g. q1",
        ).strip()
        num_blocks = pool_size(engine, group)
        zoom_start = None
        if num_blocks > MAX_CELLS:
            if right.toggle("Zoom into single blocks", key="blocks_zoom"):
                zoom_start = right.number_input(
                    f"First block (shows {MAX_CELLS:,})",
                    min_value=0,
                    max_value=max(num_blocks - 1, 0),
                    value=0,
                    step=MAX_CELLS,
                    key="blocks_zoom_start",
                )

        def body() -> None:
            with api_errors():
                draw(engine.engine_id, group, request_id, zoom_start)

        # a big table is drawn less often: a browser takes most of a second per redraw
        live(body, min_period_s=num_blocks / 20_000)
