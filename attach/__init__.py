"""`junction attach vllm|sglang`: a vLLM or SGLang engine's KV-cache events, bridged in as a
hash-keyed engine. `bridge/` reads the peer's ZeroMQ events, fills their gaps and translates
them into `Peer*` events; `cli.py` is the command; `attach_forward.py` streams them to the
control plane through `publish/`'s outbox and link; `attach_feed.py` and
`peer_feed_server.py` serve them as a cache feed `junction route` follows; `peer_scrape.py`
reads the peer's Prometheus endpoint.
"""
