"""The control plane as a fleet, and the commands it sends engines: the replicas on one store
and their heartbeats (`replicas`), the engine sockets this replica holds and the way commands
reach them (`registry`), and pins, the operator's commands, written (`pins`) and read
(`pin_reads`). Over the store alone; this process's running part in the fleet, which needs the
app's state, is `api.membership`."""
