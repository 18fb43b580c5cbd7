"""Bounds on the connections a server holds, for every HTTP server Junction runs.

uvicorn reads a request only once its connection sends one, and bounds neither a connection
that sends nothing nor one that trickles its headers: 1,000 idle sockets under a 1,024
open-file limit kept every request out of the router and the engine's OpenAI port (issue 47,
item 5). `GuardedProtocol` (`guarded.py`) is uvicorn's h11 protocol with a read timeout on each
request's headers (`header_timeout.py`) and bounds on connections, where the ones waiting for
a request (`waiting_room.py`) give way to the ones that bring one. The bounds are a
`ConnectionBounds` (`bounds.py`); `junction api` reads them from its settings, `junction route`
and `junction serve` from their command lines (`options.py`).
"""
