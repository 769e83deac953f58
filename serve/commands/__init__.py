"""The command lines of ``python -m serve``, one module per subcommand; ``--help`` imports no torch."""
