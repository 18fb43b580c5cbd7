"""Junction's engine: prefix cache, scheduler, runners and events for hybrid attention +
Mamba models.

The core (this package, less `engine/server/`) imports no web library.
"""
