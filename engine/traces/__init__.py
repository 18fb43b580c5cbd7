"""Traces through the engine: a trace's JSON lines read into requests and pins (`trace.py`),
a trace replayed with every request's record (`replay.py`, `junction replay`'s core and the
benchmarks'), and a sink that writes each cache event as a JSON line (`event_log.py`).
"""
