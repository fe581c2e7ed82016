"""``python -m gpusched`` runs the CLI."""

from gpusched.cli import main

main()
