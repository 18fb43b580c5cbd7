"""The forms that queue work on a `junction worker`: a benchmark run (`benchmark`: the modes,
runners and presets a spec may name, its size before it is queued, the runs as a table;
`benchmark_panel`: the Streamlit form that queues one) and a what-if run (`whatif`: the
settings the What-if page's form offers and builds). Each writes with the write token the
operator entered in the sidebar."""
