"""What an engine command sets up before the first step: the options `serve` and `replay`
share and the configs they build (`options.py`), an unknown option answered with the closest
known ones (`argv.py`), `--model`'s directory (`model_dir.py`), what a model costs in memory
(`footprint.py`), `--kv-cache-memory` turned into blocks and slots (`cache_memory.py`), and
what an engine says of its model (`model_card.py`).
"""
