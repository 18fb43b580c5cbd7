"""The Streamlit dashboard: it reads (and writes pins and benchmark runs through) the control
plane's REST API only. `app.py` is the navigation, `views/` the pages, `figures/` the pure
Plotly builders, `client.py` the HTTP client."""
