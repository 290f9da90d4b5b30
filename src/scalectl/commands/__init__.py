"""CLI commands, one module per command named for it (``import_`` for ``import``), each a thin
layer over the library; each module's ``register(app)`` adds its command.  :mod:`.common` holds
what several share: the store option, JSON output, errors."""
