"""The routes of engines without physical block ids (vLLM, SGLang): their hash-keyed blocks
and summary (`blocks`), and their cache read as prefixes (`views`)."""
