"""The engine's way to the control plane: the event publisher that batches each step's cache
events (`publisher.py`), its bounded outbox where unacknowledged batches wait and a snapshot
replaces them when it overflows (`outbox.py`), the websocket that says hello, resends from the
seq the store wants and streams (`publisher_link.py`), the control plane's commands applied on
the engine's own thread (`commands.py`), and the control-plane options of the engine's commands
that wire all of it from the client settings (`streaming.py`). Both `junction serve` and
`junction attach` stream through it; the engine's core knows nothing of it.
"""
