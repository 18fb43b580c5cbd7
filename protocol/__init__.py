"""The OpenAI protocol `junction serve` and `junction route` both speak: the request bodies
(`schemas.py`), a prompt rendered to token ids as the engine renders it (`prompts.py`), the
error body every failure answers with (`errors.py`) and server-sent events as OpenAI streams
them (`sse.py`). The engine's server and the router import it; it imports only the engine's
tokenizer.
"""
