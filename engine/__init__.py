"""Junction's engine: prefix cache, scheduler, runners and events for hybrid attention +
Mamba models.

The core alone: it imports no other package of the project and no web library. Its faces (the
OpenAI server, the publisher, the bridge, benchmark and what-if runs) are the packages above it.
"""
