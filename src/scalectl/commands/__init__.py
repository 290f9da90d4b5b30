"""CLI commands, one module per family; each module's ``register(app)`` adds its commands."""
