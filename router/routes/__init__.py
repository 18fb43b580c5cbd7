"""The router's HTTP routes, one module per resource."""
