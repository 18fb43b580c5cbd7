"""The engine's face to the web: an OpenAI-compatible server with metrics and a debug view.

Only this package imports web libraries (FastAPI, uvicorn, prometheus_client); the engine core
knows nothing of it. `AsyncEngine` runs the engine's steps on one thread and hands outputs to
asyncio; `create_app` builds the FastAPI app around it; `cli.add_serve_parser` adds
`junction serve`.
"""
