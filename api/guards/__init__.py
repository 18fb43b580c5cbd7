"""What stands between a request and the app: the bearer tokens (`token`), the limits on a
request before its body is read (`limits`), the bounds on connections as the API's settings
set them (`idle_connections`, over `protocol.connections`), the bounded decoding of a JSON
body (`json_body`), the priority of ingest over reads (`read_limit`), and the answers for a
store that is down or a request that fails validation (`errors`)."""
