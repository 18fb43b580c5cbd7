"""The dashboard's entry point: only the navigation between its pages."""

import streamlit as st

st.set_page_config(page_title="Junction", page_icon=":material/hub:", layout="wide")
navigation = st.navigation(
    [
        st.Page("pages/overview.py", title="Overview", icon=":material/monitoring:", default=True),
        st.Page("pages/fleet.py", title="Fleet", icon=":material/lan:"),
        st.Page("pages/block_tables.py", title="Block tables", icon=":material/grid_view:"),
        st.Page("pages/requests.py", title="Requests", icon=":material/list:"),
        st.Page("pages/checkpoints.py", title="Checkpoints", icon=":material/push_pin:"),
        st.Page("pages/peer_cache.py", title="Peer cache", icon=":material/account_tree:"),
        st.Page("pages/benchmarks.py", title="Benchmarks", icon=":material/speed:"),
        st.Page("pages/whatif.py", title="What-if", icon=":material/alt_route:"),
    ]
)
navigation.run()
