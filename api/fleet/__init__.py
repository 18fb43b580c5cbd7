"""The control plane as a fleet, and the commands it sends engines: the replicas on one store
and their heartbeats (`replicas`), this process's part in that fleet (`membership`), the
engine sockets this replica holds and the way commands reach them (`registry`), and pins, the
operator's commands, written (`pins`) and read (`pin_reads`)."""
