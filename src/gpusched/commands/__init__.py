"""Subcommands of the ``gpusched`` CLI, one module each."""
