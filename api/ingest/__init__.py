"""Ingest: the frames engines stream to the socket (`api.routes.ingest`, the protocol of
`engine.wire`) applied to the store one transaction each (`frames`), an engine's lease on its
id (`lease`), a snapshot sent in chunks put back together (`snapshot_chunks`), and the frames
the store refused, parked so the stream goes on (`dead_letters`). It builds on the concerns
each frame feeds (`api.attribution`, `api.peers`, `api.fleet`'s pins); the socket itself,
which needs the app's state, is a route."""
