"""`junction whatif`'s core: an engine's traffic replayed under other settings. A recording of
salted unit chains, from events or a trace (`recording.py`); the settings to try
(`settings.py`); the replay by hashes through the engine itself (`run.py`) and its report
(`report.py`, `table.py`); miss-ratio curves (`curves.py`: the exact LRU curve in one pass and
sampled replays of the other policies; `shards.py`: the sampled LRU curve with the shared
family prefixes counted exactly); the command's local half (`cli.py`).
"""
