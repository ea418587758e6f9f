"""``python -m helmhive`` runs the command line."""

from helmhive.cli.main import main

main()
