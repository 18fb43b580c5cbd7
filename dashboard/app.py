"""The dashboard's entry point: only the navigation between its pages.

The pages live in `views/`, not `pages/`: Streamlit runs an app with a `pages/` folder beside
its script as its old file-name multipage app until `st.navigation` is first called, so a deep
link (`/fleet`) opened first on a fresh server ran the page alone, narrow, under a menu of file
names (issue 47, item 16)."""

import streamlit as st

st.set_page_config(page_title="Junction", page_icon=":material/hub:", layout="wide")
navigation = st.navigation(
    [
        st.Page("views/overview.py", title="Overview", icon=":material/monitoring:", default=True),
        st.Page("views/fleet.py", title="Fleet", icon=":material/lan:"),
        st.Page("views/block_tables.py", title="Block tables", icon=":material/grid_view:"),
        st.Page("views/requests.py", title="Requests", icon=":material/list:"),
        st.Page("views/checkpoints.py", title="Checkpoints", icon=":material/push_pin:"),
        st.Page("views/peer_cache.py", title="Peer cache", icon=":material/account_tree:"),
        st.Page("views/benchmarks.py", title="Benchmarks", icon=":material/speed:"),
        st.Page("views/whatif.py", title="What-if", icon=":material/alt_route:"),
    ]
)
navigation.run()
