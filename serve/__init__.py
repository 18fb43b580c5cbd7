"""`junction serve`: the engine's OpenAI-compatible server, with metrics and a debug view, and
`junction replay`, a trace through the engine without one.

`AsyncEngine` runs the engine's steps on one thread and hands outputs to asyncio
(`async_engine.py`, each request's `RequestStream` in `request_stream.py`); `create_app`
builds the FastAPI app around it (`app.py`, one module a route in `routes/`: completions,
chat, models, the cache feed, ops); `generation.py` runs one request, `text_stream.py` turns
its tokens into text, `errors.py` says the engine's refusals as OpenAI errors; `cli.py` adds
`junction serve` and `replay_cli.py` `junction replay`. What the router shares of the OpenAI
protocol is `protocol/`; the way to the control plane is `publish/`.
"""
