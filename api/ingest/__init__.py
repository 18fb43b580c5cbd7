"""Ingest: the websocket engines stream their frames to (`route`, the protocol of
`engine.wire`), the frames applied to the store one transaction each (`frames`), a snapshot
sent in chunks put back together (`snapshot_chunks`), and the frames the store refused, parked
so the stream goes on (`dead_letters`)."""
