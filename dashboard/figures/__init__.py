"""Pure figure builders: data frames in, Plotly figures out (no Streamlit, no HTTP)."""
