"""The `junction` command: every package's subcommands gathered under one parser (`cli.main`).

The top of the layers: it may import any package, and none imports it."""
