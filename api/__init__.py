"""Junction's control plane: the store of every engine's cache events, behind a REST API."""
